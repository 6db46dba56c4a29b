package local

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// SpecPolicy is everything the OCI spec of one sandbox is built from.
type SpecPolicy struct {
	Env []string
	// UID and GID are the code's user; the driver starts the code as them.
	UID, GID uint32
	// Preload starts the driver's warm Python worker (pooled sandboxes),
	// importing PreloadModules.
	Preload        bool
	PreloadModules []string
	Limits         runtime.Limits
	Hostname       string
	CgroupsPath    string
	// NetNSPath joins a prepared network namespace (egress runs); empty
	// creates a new, empty one (loopback only).
	NetNSPath string
}

// cpuPeriod is the CFS period the CPU quota is expressed in (100 ms).
const cpuPeriod = 100000

// Spec builds the OCI runtime spec of a sandbox from its policy. It is a pure
// function, so the security baseline can be checked without containerd:
// read-only root, size-capped tmpfs at /workspace and /tmp, the driver as
// init with only the capabilities to start the code as the unprivileged
// user, no_new_privs, fresh namespaces including an empty network namespace
// (loopback only), and cgroup limits.
func Spec(p SpecPolicy) (*specs.Spec, error) {
	if err := runtime.CheckSandbox(p.UID, p.GID, p.Limits); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	l := p.Limits
	hostname := p.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	mem := l.MemoryBytes
	quota := int64(l.CPUs * cpuPeriod)
	period := uint64(cpuPeriod)
	disableOOMKiller := false
	noSwap := mem // memory+swap equal to memory: no swap
	hostPids := HostPidsLimit(l.Pids)

	s := &specs.Spec{
		Version:     specs.Version,
		Hostname:    hostname,
		Annotations: map[string]string{},
		Root:        &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			// The driver is root inside gVisor's kernel, never on the host;
			// the code it starts is p.UID with no capabilities.
			User: specs.User{UID: 0, GID: 0},
			Args: runtime.DriverArgs(p.UID, p.GID, p.Preload, p.PreloadModules),
			Env:  append([]string(nil), p.Env...),
			Cwd:  "/workspace",
			// Explicit sets, not nil: nil would leave the runtime's defaults.
			Capabilities: &specs.LinuxCapabilities{
				Bounding:    append([]string(nil), runtime.DriverCapabilities...),
				Effective:   append([]string(nil), runtime.DriverCapabilities...),
				Inheritable: []string{},
				Permitted:   append([]string(nil), runtime.DriverCapabilities...),
				Ambient:     []string{},
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024},
				{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
				// The code's process limit, enforced by gVisor's kernel. All
				// the code's processes share one uid, so it bounds the code.
				{Type: "RLIMIT_NPROC", Hard: uint64(l.Pids), Soft: uint64(l.Pids)},
				// File size is bounded by the tmpfs caps, which fail with ENOSPC.
			},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=16m"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			tmpfs("/workspace", l.WorkspaceBytes, "mode=0755", fmt.Sprintf("uid=%d", p.UID), fmt.Sprintf("gid=%d", p.GID)),
			tmpfs("/tmp", l.TmpBytes, "mode=1777"),
			// Root-owned: the driver writes the code here, the code reads it.
			tmpfs(driver.CodeDir, runtime.CodeDirBytes, "mode=0755", "uid=0", "gid=0"),
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				// A new, empty network namespace (loopback only) unless the
				// run's egress network was prepared for it.
				{Type: specs.NetworkNamespace, Path: p.NetNSPath},
			},
			CgroupsPath: p.CgroupsPath,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &mem, Swap: &noSwap, DisableOOMKiller: &disableOOMKiller},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &hostPids},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
				"/proc/scsi", "/sys/firmware",
			},
			ReadonlyPaths: []string{
				"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq",
				"/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}
	return s, nil
}

// HostPidsLimit is the host pids cgroup limit for a sandbox whose code may
// run pids processes. On the host the sandbox is gVisor's sentry and gofer
// threads plus a systrap stub per guest thread, so the cgroup needs headroom
// over the guest limit; it is a backstop that keeps a runaway sentry bounded,
// while RLIMIT_NPROC is the limit the code meets first.
func HostPidsLimit(pids int64) int64 { return 2*pids + 64 }

func tmpfs(dest string, size int64, extra ...string) specs.Mount {
	opts := append([]string{"nosuid", "nodev"}, extra...)
	return specs.Mount{
		Destination: dest,
		Type:        "tmpfs",
		Source:      "tmpfs",
		Options:     append(opts, fmt.Sprintf("size=%d", size)),
	}
}
