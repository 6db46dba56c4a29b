package local

import (
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

func testLimits() runtime.Limits {
	return runtime.Limits{Timeout: time.Second, MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 128, StdoutBytes: 10, StderrBytes: 10, WorkspaceBytes: 64 << 20, TmpBytes: 32 << 20}
}

func TestSpecSecurityBaseline(t *testing.T) {
	s, err := Spec(SpecPolicy{Env: []string{"A=1"}, UID: 1000, GID: 1000, Limits: testLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly {
		t.Error("root filesystem is writable")
	}
	p := s.Process
	// Init is the driver: root inside gVisor, starting the code as 1000.
	if p.User.UID != 0 || strings.Join(p.Args, " ") != driver.Path+" --uid 1000 --gid 1000" {
		t.Errorf("init = %+v %v, want the driver starting the code as 1000:1000", p.User, p.Args)
	}
	if !p.NoNewPrivileges {
		t.Error("no_new_privs is off")
	}
	c := p.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if strings.Join(set, ",") != "CAP_KILL,CAP_SETGID,CAP_SETPCAP,CAP_SETUID" {
			t.Errorf("%s capabilities = %v, want only what the driver needs to change user", name, set)
		}
	}
	for name, set := range map[string][]string{"inheritable": c.Inheritable, "ambient": c.Ambient} {
		if set == nil || len(set) != 0 {
			t.Errorf("%s capabilities = %v, want an explicit empty set", name, set)
		}
	}
	if pre, _ := Spec(SpecPolicy{UID: 1000, GID: 1000, Preload: true, PreloadModules: []string{"numpy", "pandas"}, Limits: testLimits()}); !contains(pre.Process.Args, "--preload") || !contains(pre.Process.Args, "--preload-modules=numpy,pandas") {
		t.Errorf("a pooled sandbox's driver does not preload: %v", pre.Process.Args)
	}
	if p.Cwd != "/workspace" {
		t.Errorf("cwd = %q", p.Cwd)
	}
	if strings.Join(p.Env, ",") != "A=1" {
		t.Errorf("env = %v, want only what the policy gave", p.Env)
	}
	var netns bool
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			netns = true
			if ns.Path != "" {
				t.Errorf("network namespace joins %q; want a new, empty one", ns.Path)
			}
		}
	}
	if !netns {
		t.Error("no network namespace: the sandbox would share the host's network")
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
		t.Errorf("memory = %d swap = %d", *r.Memory.Limit, *r.Memory.Swap)
	}
	if *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("cpu quota/period = %d/%d, want 150000/100000", *r.CPU.Quota, *r.CPU.Period)
	}
	if *r.Pids.Limit != HostPidsLimit(128) || HostPidsLimit(128) <= 128 {
		t.Errorf("host pids = %d, want headroom over 128", *r.Pids.Limit)
	}
	var nproc bool
	for _, rl := range p.Rlimits {
		if rl.Type == "RLIMIT_NPROC" && rl.Hard == 128 && rl.Soft == 128 {
			nproc = true
		}
	}
	if !nproc {
		t.Errorf("rlimits %v lack RLIMIT_NPROC=128", p.Rlimits)
	}
	mounts := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		mounts[m.Destination] = m
		if m.Type == "bind" || strings.Contains(strings.Join(m.Options, ","), "bind") {
			t.Errorf("mount %s binds a host path", m.Destination)
		}
	}
	if m, ok := mounts[driver.CodeDir]; !ok || m.Type != "tmpfs" || !contains(m.Options, "uid=0") || !contains(m.Options, "mode=0755") {
		t.Errorf("%s is not a root-owned tmpfs: %+v", driver.CodeDir, m)
	}
	for dest, size := range map[string]string{"/workspace": "size=67108864", "/tmp": "size=33554432"} {
		m, ok := mounts[dest]
		if !ok || m.Type != "tmpfs" {
			t.Fatalf("%s is not a tmpfs: %+v", dest, m)
		}
		if !contains(m.Options, size) {
			t.Errorf("%s options %v lack %s", dest, m.Options, size)
		}
	}
	if !contains(mounts["/workspace"].Options, "uid=1000") {
		t.Errorf("/workspace is not owned by the sandbox user: %v", mounts["/workspace"].Options)
	}
}

func TestSpecRefusesBadPolicy(t *testing.T) {
	ok := SpecPolicy{UID: 1000, GID: 1000, Limits: testLimits()}
	cases := map[string]func(*SpecPolicy){
		"root uid":   func(p *SpecPolicy) { p.UID = 0 },
		"root gid":   func(p *SpecPolicy) { p.GID = 0 },
		"no memory":  func(p *SpecPolicy) { p.Limits.MemoryBytes = 0 },
		"no pids":    func(p *SpecPolicy) { p.Limits.Pids = 0 },
		"no tmp cap": func(p *SpecPolicy) { p.Limits.TmpBytes = 0 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := ok
			mutate(&p)
			if _, err := Spec(p); err == nil {
				t.Error("Spec accepted it")
			}
		})
	}
}

func TestSpecDoesNotAliasPolicy(t *testing.T) {
	p := SpecPolicy{Env: []string{"X=1"}, UID: 1, GID: 1, Limits: testLimits()}
	s, _ := Spec(p)
	p.Env[0] = "changed"
	if s.Process.Env[0] != "X=1" {
		t.Error("spec shares slices with the policy")
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
