package runtime

import (
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func testLimits() Limits {
	return Limits{Timeout: time.Second, MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 128, StdoutBytes: 10, StderrBytes: 10, WorkspaceBytes: 64 << 20, TmpBytes: 32 << 20}
}

func TestSpecSecurityBaseline(t *testing.T) {
	s, err := Spec(SpecPolicy{Args: []string{"/usr/bin/python3", "-"}, Env: []string{"A=1"}, UID: 1000, GID: 1000, Limits: testLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly {
		t.Error("root filesystem is writable")
	}
	p := s.Process
	if p.User.UID != 1000 || p.User.GID != 1000 {
		t.Errorf("user = %+v, want 1000:1000", p.User)
	}
	if !p.NoNewPrivileges {
		t.Error("no_new_privs is off")
	}
	c := p.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted, "inheritable": c.Inheritable, "ambient": c.Ambient} {
		if set == nil || len(set) != 0 {
			t.Errorf("%s capabilities = %v, want an explicit empty set", name, set)
		}
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
	ok := SpecPolicy{Args: []string{"true"}, UID: 1000, GID: 1000, Limits: testLimits()}
	cases := map[string]func(*SpecPolicy){
		"no command": func(p *SpecPolicy) { p.Args = nil },
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
	p := SpecPolicy{Args: []string{"a"}, Env: []string{"X=1"}, UID: 1, GID: 1, Limits: testLimits()}
	s, _ := Spec(p)
	p.Args[0], p.Env[0] = "changed", "changed"
	if s.Process.Args[0] != "a" || s.Process.Env[0] != "X=1" {
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
