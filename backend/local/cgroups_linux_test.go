package local

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseCounter(t *testing.T) {
	cases := []struct {
		name, file, key string
		want            int64
		ok              bool
	}{
		{"v1 oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill", 3, true},
		{"v2 memory.events kills", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill", 1, true},
		{"v2 memory.events limit hits", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n", "max", 12, true},
		{"none yet", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "oom_kill", 0, true},
		// An old kernel's oom_control has no count: the event decides.
		{"no count", "oom_kill_disable 0\nunder_oom 0\n", "oom_kill", 0, false},
		{"oom is not oom_kill", "oom 4\n", "oom_kill", 0, false},
		{"garbage", "oom_kill x\n", "oom_kill", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, ok := parseCounter([]byte(c.file), c.key)
			if n != c.want || ok != c.ok {
				t.Errorf("parseCounter(%q) = %d, %v; want %d, %v", c.key, n, ok, c.want, c.ok)
			}
		})
	}
}

func TestRanOutOfMemory(t *testing.T) {
	before := memoryCounts{Kills: 2, LimitHits: 10}
	cases := []struct {
		name  string
		exit  int
		after memoryCounts
		want  bool
	}{
		{"killed by the OOM killer", 137, memoryCounts{3, 11}, true},
		// The seen flake: an allocation refused at the limit, Python's
		// MemoryError, exit 1 and no kill.
		{"MemoryError at the limit", 1, memoryCounts{2, 14}, true},
		{"another process killed, the code failed", 1, memoryCounts{3, 10}, true},
		{"a plain failure", 1, memoryCounts{2, 10}, false},
		{"a plain kill by signal 9", 137, memoryCounts{2, 10}, false},
		{"met the limit and recovered", 0, memoryCounts{2, 30}, false},
		{"exit 0 after a kill of another process", 0, memoryCounts{3, 11}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ranOutOfMemory(c.exit, before, c.after); got != c.want {
				t.Errorf("ranOutOfMemory(%d, %+v, %+v) = %v, want %v", c.exit, before, c.after, got, c.want)
			}
		})
	}
}

// testCgroup makes the cgroup a sandbox id of a fresh deployment would
// have, with memory and cpu controllers, and removes it when the test ends.
func testCgroup(t *testing.T) (deployment, id, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("not root under CI=true")
		}
		t.Skip("not root")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	deployment, id = "test"+hex.EncodeToString(b), "airlock-oomcount"
	v1 := filepath.Join(cgroupRoot, "memory") // present on a v1 host only
	var dirs []string
	if _, err := os.Stat(v1); err == nil {
		for _, h := range []string{"memory", "cpu"} {
			d := filepath.Join(cgroupRoot, h, CgroupsPath(deployment, id))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, d)
		}
	} else {
		d := filepath.Join(cgroupRoot, CgroupsPath(deployment, id))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// cgroup v2 gives a child only the controllers its parent passes on.
		for _, p := range []string{filepath.Join(cgroupRoot, "airlock"), filepath.Dir(d)} {
			if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+memory +cpu"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		dirs = append(dirs, d)
	}
	t.Cleanup(func() {
		for _, d := range dirs {
			emptyCgroup(t, d)
			if err := removeCgroup(filepath.Dir(d)); err != nil {
				t.Errorf("remove test cgroup: %v", err)
			}
		}
	})
	return deployment, id, dirs[0]
}

// The memory counts are read from the cgroup a sandbox of that deployment
// and id really has: a process there that outgrows the limit is counted.
func TestMemoryCountersReadTheSandboxCgroup(t *testing.T) {
	deployment, id, dir := testCgroup(t)
	if c, ok := memoryCounters(deployment, id); !ok || c != (memoryCounts{}) {
		t.Fatalf("before: memoryCounters = %+v, %v; want zero, true", c, ok)
	}
	limit := map[string]string{"memory.limit_in_bytes": "33554432", "memory.max": "33554432", "memory.swap.max": "0"}
	set := 0
	for f, v := range limit {
		if os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644) == nil {
			set++
		}
	}
	if set == 0 {
		t.Fatal("could not set a memory limit")
	}
	// The shell waits for its line on stdin until it is in the cgroup,
	// then holds 128 MiB in a variable.
	cmd := exec.Command("sh", "-c", `read go; x=$(head -c 134217728 /dev/zero | tr '\0' a); echo survived`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	_, _ = stdin.Write([]byte("go\n"))
	_ = stdin.Close()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the shell ended with %v; want killed by the OOM killer", err)
	}
	if c, ok := memoryCounters(deployment, id); !ok || c.Kills < 1 || c.LimitHits < 1 {
		t.Fatalf("after: memoryCounters = %+v, %v; want a kill and a limit hit", c, ok)
	}
}

// An idle pooled sandbox's CPU weight lands in its own cgroup.
func TestSetCPUSharesWritesTheSandboxCgroup(t *testing.T) {
	deployment, id, _ := testCgroup(t)
	if err := setCPUShares(deployment, id, cpuSharesIdle); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cpu.shares": strconv.Itoa(cpuSharesIdle), "cpu.weight": "1"}
	for _, dir := range sandboxCgroupDirs(deployment, id, "cpu") {
		for f, v := range want {
			if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				if got := strings.TrimSpace(string(b)); got != v {
					t.Errorf("%s = %s; want %s", filepath.Join(dir, f), got, v)
				}
				return
			}
		}
	}
	t.Fatal("no cpu weight file in the sandbox's cgroup")
}

// emptyCgroup kills what is left in cgroup dir (the OOM killer takes one
// process; its pipeline ends on its own, a moment later) and waits until
// the cgroup is empty.
func emptyCgroup(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || strings.TrimSpace(string(b)) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cgroup %s still holds %q", dir, b)
			return
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}
