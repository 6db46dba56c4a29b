package runtime

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

func TestParseOOMKill(t *testing.T) {
	cases := []struct {
		name, file string
		want       int64
		ok         bool
	}{
		{"v1 oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", 3, true},
		{"v2 memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n", 1, true},
		{"none yet", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", 0, true},
		// An old kernel's oom_control has no count: the event decides.
		{"no count", "oom_kill_disable 0\nunder_oom 0\n", 0, false},
		{"oom is not oom_kill", "oom 4\n", 0, false},
		{"garbage", "oom_kill x\n", 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, ok := parseOOMKill([]byte(c.file))
			if n != c.want || ok != c.ok {
				t.Errorf("parseOOMKill = %d, %v; want %d, %v", n, ok, c.want, c.ok)
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

// The OOM count is read from the cgroup a sandbox of that deployment and
// id really has: a process there that outgrows the limit is counted.
func TestOOMKillsCountsTheSandboxCgroup(t *testing.T) {
	deployment, id, dir := testCgroup(t)
	if n, ok := oomKills(deployment, id); !ok || n != 0 {
		t.Fatalf("before: oomKills = %d, %v; want 0, true", n, ok)
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
	if n, ok := oomKills(deployment, id); !ok || n < 1 {
		t.Fatalf("after: oomKills = %d, %v; want at least 1", n, ok)
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
