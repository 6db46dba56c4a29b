package local_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/backend/local/instance"
	"github.com/airlock-mcp/airlock/runtime"
)

// startLong starts a run that prints "up" and then sleeps, and returns once
// "up" has arrived, with a channel for the run's end.
func startLong(t *testing.T, m runtime.Manager, runID string) <-chan runOutcome {
	t.Helper()
	up := make(chan struct{}, 1)
	done := make(chan runOutcome, 1)
	go func() {
		res, err := m.Run(context.Background(), runtime.Request{
			RunID: runID, Language: runtime.Python, Code: "import time\nprint('up', flush=True)\ntime.sleep(20)\nprint('finished')",
			Limits: limits(),
			Output: func(_ runtime.Stream, b []byte) {
				if strings.Contains(string(b), "up") {
					select {
					case up <- struct{}{}:
					default:
					}
				}
			},
		})
		done <- runOutcome{res, err}
	}()
	select {
	case <-up:
	case o := <-done:
		t.Fatalf("the run ended before it started: %+v", o)
	case <-time.After(60 * time.Second):
		t.Fatal("the run did not start in 60 s")
	}
	return done
}

type runOutcome struct {
	res runtime.Result
	err error
}

// sentryPIDs are the runsc processes of container id (the sandbox's
// sentry and gofer).
func sentryPIDs(t *testing.T, id string) []int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 2 || !strings.Contains(args[0], "runsc") {
			continue
		}
		cmd := strings.Join(args, " ")
		if strings.Contains(cmd, " boot ") && strings.HasSuffix(strings.TrimSpace(cmd), id) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestSentryKilledMidRun kills a sandbox's gVisor sentry while its code
// runs: the call gets a clear result at once, nothing is left behind, and
// the next call works.
func TestSentryKilledMidRun(t *testing.T) {
	s := need(t)
	runID := runtime.NewRunID()
	done := startLong(t, s.Manager, runID)
	pids := sentryPIDs(t, "airlock-"+runID)
	if len(pids) == 0 {
		t.Fatal("no runsc boot process found for the run's sandbox")
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	var o runOutcome
	select {
	case o = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not end within 30 s of its sentry being killed")
	}
	var ie *runtime.InfraError
	if !errors.As(o.err, &ie) || strings.Contains(o.res.Stdout, "finished") {
		t.Fatalf("after the sentry was killed: result %+v, err %v; want an InfraError", o.res, o.err)
	}
	t.Logf("the call was told: %v", o.err)
	if r := run(t, runtime.Python, "print('next')"); r.ExitCode != 0 || r.Stdout != "next\n" {
		t.Fatalf("the next call: %+v", r)
	}
	assertNoSandboxes(t, s)
}

// TestContainerdKilledMidRun SIGKILLs the embedded containerd while a run
// is in flight: the run ends with a clear result (or completes: the shim
// outlives containerd), the supervisor restarts containerd, the leftovers
// are reconciled away, and service resumes without restarting airlock.
func TestContainerdKilledMidRun(t *testing.T) {
	s := need(t)
	needOwnContainerd(t, s)
	old := s.Daemon.PID()
	done := startLong(t, s.Manager, runtime.NewRunID())
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var o runOutcome
	select {
	case o = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the in-flight call did not end within 90 s of containerd being killed")
	}
	switch {
	case o.err == nil && strings.Contains(o.res.Stdout, "finished"):
		t.Log("the run completed: its shim and sandbox outlived containerd")
	case errors.Is(o.err, runtime.ErrRuntimeRestarted):
		t.Logf("the call was told: %v", o.err)
	default:
		t.Fatalf("in-flight call: result %+v, err %v; want completion or ErrRuntimeRestarted", o.res, o.err)
	}
	waitContainerdRestarted(t, s, old)
	// Service resumes: a call works (retrying while the client reconnects).
	var last error
	for i := 0; ; i++ {
		res, err := s.Manager.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print('back')", Limits: limits()})
		if err == nil && res.Stdout == "back\n" {
			break
		}
		last = fmt.Errorf("%+v, %w", res, err)
		if i == 20 {
			t.Fatalf("no working call within 20 tries after the restart: %v", last)
		}
		time.Sleep(time.Second)
	}
	// What the dead daemon's runs left is reconciled away.
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.Manager.WaitTeardowns()
		if countContainers(t, s) == 0 {
			break
		}
		if time.Now().After(deadline) {
			assertNoSandboxes(t, s)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestRemoveStaleCgroups makes a sandbox-named cgroup with no container
// behind it (what a runsc killed mid-teardown leaves), one holding a
// process, and a stale one of another deployment: only the first goes.
func TestRemoveStaleCgroups(t *testing.T) {
	s := need(t)
	var hier string
	for _, h := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err == nil {
			hier = h
			break
		}
	}
	if hier == "" {
		t.Fatal("no cgroup hierarchy found under /sys/fs/cgroup")
	}
	parent := filepath.Join(hier, local.CgroupsPath(s.Deployment, ""))
	otherParent := filepath.Join(hier, local.CgroupsPath("0123456789ab", ""))
	stale := filepath.Join(parent, "airlock-teststale"+runtime.NewRunID())
	busy := filepath.Join(parent, "airlock-testbusy"+runtime.NewRunID())
	otherStale := filepath.Join(otherParent, "airlock-teststale"+runtime.NewRunID())
	for _, d := range []string{parent, otherParent} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	defer os.Remove(otherParent)
	for _, d := range []string{stale, filepath.Join(stale, "child"), busy, otherStale} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	defer os.Remove(otherStale)
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = sleeper.Process.Kill()
		_ = sleeper.Wait()
		_ = os.Remove(busy)
	}()
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := local.RemoveStaleCgroups(context.Background(), s.Client, s.Config.Containerd.Namespace, s.Deployment); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(otherStale); err != nil {
		t.Errorf("another deployment's cgroup was removed: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale cgroup %s survived: %v", stale, err)
	}
	if _, err := os.Stat(busy); err != nil {
		t.Errorf("a cgroup with a process in it was removed: %v", err)
	}
}

// TestRemoveOrphanSandboxProcesses starts processes that look like runsc's
// to the sweep (argv[0] runsc-gofer, a runsc root, a containerd bundle
// path): the one for an airlock sandbox of this deployment containerd does
// not know is killed; those of another namespace, another deployment (its
// own daemon does know it) or not airlock's are left alone.
func TestRemoveOrphanSandboxProcesses(t *testing.T) {
	s := need(t)
	ns := s.Config.Containerd.Namespace
	ours := filepath.Join(local.RunscRoot(s.Deployment), ns)
	start := func(bundle string, root ...string) *exec.Cmd {
		t.Helper()
		r := ours
		if len(root) > 0 {
			r = root[0]
		}
		cmd := exec.Command("bash", "-c", `exec -a runsc-gofer /usr/bin/python3 -c 'import time; time.sleep(120)' --root "$1" gofer --bundle "$0"`, bundle, r)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	orphan := start("/state/io.containerd.runtime.v2.task/" + ns + "/airlock-orphan" + runtime.NewRunID())
	other := start("/state/io.containerd.runtime.v2.task/someone-else/airlock-x" + runtime.NewRunID())
	notOurs := start("/state/io.containerd.runtime.v2.task/" + ns + "/web-" + runtime.NewRunID())
	otherDeployment := start("/other/io.containerd.runtime.v2.task/"+ns+"/airlock-theirs"+runtime.NewRunID(), filepath.Join(local.RunscRoot("0123456789ab"), ns))
	time.Sleep(300 * time.Millisecond) // exec -a done
	n, err := local.RemoveOrphanSandboxProcesses(context.Background(), s.Client, ns, s.Deployment)
	if err != nil || n != 1 {
		t.Fatalf("killed %d, err %v; want 1", n, err)
	}
	if err := orphan.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("the orphan: %v; want killed", err)
	}
	for name, c := range map[string]*exec.Cmd{"another namespace's": other, "a non-airlock container's": notOurs, "another deployment's": otherDeployment} {
		if c.ProcessState != nil || syscall.Kill(c.Process.Pid, 0) != nil {
			t.Errorf("%s process was killed", name)
		}
	}
}

// A sandbox whose exit wait broke when containerd restarted (its task
// still running under its shim) is killed and deleted when it is
// destroyed. A plain Delete of the running task failed, and the sandbox
// ran on, untracked: another airlock on the host kept two retired pool
// sandboxes running that way until it exited.
func TestDestroyAfterContainerdRestart(t *testing.T) {
	s := need(t)
	needOwnContainerd(t, s)
	sess := openSession(t)
	if r := cell(t, sess, runtime.Python, "x = 1", 20*time.Second); r.ExitCode != 0 {
		t.Fatalf("first cell: %+v", r)
	}
	old := s.Daemon.PID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitContainerdRestarted(t, s, old)
	deadline := time.Now().Add(60 * time.Second)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	for _, err := s.Client.Version(ctx); err != nil; _, err = s.Client.Version(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("containerd does not answer after its restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sess.Close()
	s.Manager.WaitTeardowns()
	// At once, not after the restart's reconcile passes, which would
	// remove what destroy left and hide it.
	cs, err := s.Client.Containers(ctx, fmt.Sprintf("labels.%q==%s", local.LabelInstance, s.Instance.ID))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		t.Errorf("container %s left behind by its destroy", c.ID())
	}
}

// needOwnContainerd skips a test that kills the embedded containerd unless
// this test's instance is the only one using it: the daemon is the
// deployment's, and killing it under another airlock serving on the same
// state_dir would break that one's sandboxes, which no test may touch.
func needOwnContainerd(t *testing.T, s *boot.Stack) {
	t.Helper()
	if s.Daemon == nil {
		t.Skip("an external containerd is configured; only the embedded one is supervised")
	}
	if others := instance.Others(s.Config.StateDir, s.Instance.ID); len(others) > 0 {
		t.Skipf("other airlock instances share this state_dir's containerd (%v); not killing it under them", others)
	}
}

// waitContainerdRestarted waits until the supervisor has replaced the
// containerd whose pid was old.
func waitContainerdRestarted(t *testing.T, s *boot.Stack, old int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for s.Daemon.PID() == 0 || s.Daemon.PID() == old {
		if time.Now().After(deadline) {
			t.Fatal("containerd was not restarted within 60 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
