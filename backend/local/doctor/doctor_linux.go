// Package doctor checks a host for everything airlock needs and names the
// fix for each problem it finds.
package doctor

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/checks"
	"github.com/airlock-mcp/airlock/runtime/image"
)

// Check is one finding.
type Check = checks.Check

const installFix = "run scripts/install-deps.sh as root (or `make serve`, which runs it)"

// CNIDirs are where CNI plugins are looked for: Debian's, then the upstream default.
var CNIDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// Run performs every check, prints a report to w and reports whether all passed.
func Run(ctx context.Context, cfg config.Config, w io.Writer, log *slog.Logger) bool {
	found := Host(cfg)
	allHost := true
	for _, c := range found {
		allHost = allHost && c.OK
	}
	if allHost {
		found = append(found, Live(ctx, cfg, log)...)
	} else {
		found = append(found, Check{Name: "sandbox", Detail: "not tried: fix the problems above first"})
	}
	return checks.Print(w, found)
}

// Host checks what can be seen without starting anything.
func Host(cfg config.Config) []Check {
	var out []Check
	out = append(out, Check{Name: "root", OK: config.IsRoot(), Detail: fmt.Sprintf("euid %d", os.Geteuid()),
		Fix: "run airlock as root (sandboxes need it); desktop clients connect to a root daemon"})

	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fs, _ := os.ReadFile("/proc/filesystems")
	out = append(out, Check{Name: "overlayfs", OK: strings.Contains(string(fs), "overlay"),
		Detail: "kernel " + strings.TrimSpace(string(kernel)), Fix: "load the overlay module: modprobe overlay"})
	cg := cgroupControllers()
	out = append(out, Check{Name: "cgroups", OK: cg["memory"] && cg["pids"] && cg["cpu"],
		Detail: fmt.Sprintf("memory=%v pids=%v cpu=%v (%s)", cg["memory"], cg["pids"], cg["cpu"], cgroupMode()),
		Fix:    "enable the memory, pids and cpu cgroup controllers (kernel command line cgroup_enable=memory)"})

	if cfg.Containerd.Address == "" {
		out = append(out, binaryCheck("containerd", cfg.Containerd.Binary, "--version", " 2."))
	} else {
		_, err := os.Stat(cfg.Containerd.Address)
		out = append(out, Check{Name: "containerd", OK: err == nil, Detail: "external daemon at " + cfg.Containerd.Address,
			Fix: "start that containerd, or set containerd.address to \"\" to use the embedded one"})
	}
	out = append(out, binaryCheck("runc shim", "containerd-shim-runc-v2", "-v", ""))
	out = append(out, binaryCheck("gvisor shim", "containerd-shim-runsc-v1", "-v", ""))
	rc := binaryCheck("runsc", cfg.Runtime.Runsc, "--version", "")
	if rc.OK {
		p, _ := exec.LookPath(cfg.Runtime.Runsc)
		if dyn, err := isDynamic(p); err != nil || dyn {
			rc.OK = false
			rc.Detail = p + " is dynamically linked: it fails after pivoting into its empty root"
			rc.Fix = "rebuild it with CGO_ENABLED=0 (" + installFix + ")"
		}
	}
	out = append(out, rc)

	var missing []string
	dir := ""
	for _, d := range CNIDirs {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			dir = d
			break
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "firewall"} {
		if dir == "" {
			missing = append(missing, p)
		} else if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			missing = append(missing, p)
		}
	}
	out = append(out, Check{Name: "cni", OK: len(missing) == 0, Detail: fmt.Sprintf("plugins in %q, missing %v", dir, missing),
		Fix: "apt-get install containernetworking-plugins (" + installFix + ")"})
	nft := Check{Name: "nftables", Fix: "apt-get install nftables (" + installFix + ")"}
	if b, err := exec.Command("nft", "list", "tables").CombinedOutput(); err != nil {
		nft.Detail = strings.TrimSpace(string(b) + " " + err.Error())
	} else {
		nft.OK, nft.Detail = true, "nft list tables works"
	}
	out = append(out, nft)
	out = append(out, lsmCheck("/"))
	return out
}

// Live starts the runtime and checks the image and which shim starts a sandbox.
func Live(ctx context.Context, cfg config.Config, log *slog.Logger) []Check {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stack, err := boot.Up(ctx, cfg, boot.NeedClient, quiet)
	if err != nil {
		return []Check{{Name: "containerd", Detail: err.Error(), Fix: installFix}}
	}
	defer stack.Close(context.WithoutCancel(ctx))
	out := []Check{{Name: "containerd", OK: true, Detail: "connected"}}
	nctx := namespaces.WithNamespace(ctx, cfg.Containerd.Namespace)
	img, err := image.Ensure(nctx, stack.Client, cfg.Image)
	if err != nil {
		return append(out, Check{Name: "image", Detail: err.Error(), Fix: "run `airlock image build` (or `airlock image import FILE --tag " + cfg.Image + "`)"})
	}
	out = append(out, Check{Name: "image", OK: true, Detail: cfg.Image})
	o, err := stack.ManagerOptions(img, quiet)
	if err != nil {
		return append(out, Check{Name: "runsc", Detail: err.Error(), Fix: installFix})
	}
	var working []string
	for _, shim := range boot.ShimPreference {
		if err := boot.ProbeShim(ctx, o, shim); err != nil {
			msg := firstLine(err.Error())
			out = append(out, Check{Name: "shim", OK: true, Detail: shim + " does not start here: " + msg})
			continue
		}
		working = append(working, shim)
		out = append(out, Check{Name: "shim", OK: true, Detail: shim + " starts a gVisor sandbox"})
	}
	c := Check{Name: "sandbox", OK: len(working) > 0, Fix: "see the shim lines above and " + installFix}
	switch {
	case len(working) == 0:
		c.Detail = "no shim can start a sandbox"
	case cfg.Runtime.Shim == config.ShimAuto:
		c.Detail = "runtime.shim auto picks " + working[0]
	default:
		c.OK = contains(working, cfg.Runtime.Shim)
		c.Detail = "runtime.shim is " + cfg.Runtime.Shim
		c.Fix = "set runtime.shim to auto or " + working[0]
	}
	_ = log
	return append(out, c)
}

func binaryCheck(name, bin, versionFlag, want string) Check {
	c := Check{Name: name, Fix: installFix}
	p, err := exec.LookPath(bin)
	if err != nil {
		c.Detail = bin + " not found on PATH"
		return c
	}
	b, _ := exec.Command(p, versionFlag).CombinedOutput()
	v := strings.Join(strings.Fields(firstLines(string(b), 2)), " ")
	if want != "" && !strings.Contains(v, want) {
		c.Detail = fmt.Sprintf("%s is %q, want %s*", p, v, want)
		return c
	}
	c.OK, c.Detail = true, p+" "+v
	return c
}

func isDynamic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true, nil
		}
	}
	return false, nil
}

func cgroupMode() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "cgroup v2"
	}
	return "cgroup v1"
}

func cgroupControllers() map[string]bool {
	out := map[string]bool{}
	b, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[3] == "1" {
			out[f[0]] = true
		}
	}
	return out
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return firstLine(strings.Join(lines, " "))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
