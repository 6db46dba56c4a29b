package local_test

// These tests run real sandboxes: a real containerd (embedded, under
// AIRLOCK_TEST_STATE_DIR, default /var/lib/airlock), real runsc, and the
// image `airlock image build` makes. Without them they skip, except under
// CI=true, where a missing prerequisite fails the run.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/image-spec/identity"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
)

var (
	stack    *boot.Stack
	setupErr error
)

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			setupErr = errors.New("not root")
		} else if _, err := exec.LookPath("runsc"); err != nil {
			setupErr = fmt.Errorf("runsc: %w", err)
		} else {
			cfg := testConfig()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			stack, setupErr = boot.Up(ctx, cfg, boot.NeedManager, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if stack != nil {
				defer stack.Close(context.Background())
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func testConfig() config.Config {
	cfg := config.Defaults()
	if d := os.Getenv("AIRLOCK_TEST_STATE_DIR"); d != "" {
		cfg.StateDir = d
	}
	cfg.Log.Level = "warn"
	// No wait queue: TestConcurrencyLimit wants the busy answer at once
	// (the queue itself is tested in admission_test.go and end to end).
	cfg.Limits.Queue = 0
	// Cold sandboxes here; pool_linux_test.go tests the pool on its own.
	cfg.Pool.Size = 0
	// Booted sandboxes here: template_linux_test.go tests restored ones
	// against them.
	cfg.Pool.Restore = false
	return cfg
}

// need skips (or, under CI=true, fails) when no real runtime is available.
func need(t *testing.T) *boot.Stack {
	t.Helper()
	if setupErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sandbox runtime unavailable under CI=true: %v (run scripts/install-deps.sh and `airlock image build`)", setupErr)
		}
		t.Skipf("sandbox runtime unavailable: %v", setupErr)
	}
	// Every test starts with the sandboxes of earlier tests torn down:
	// a sandbox holds its admission slot until it is gone, and a test
	// that finds none free would fail for another test's sake.
	stack.Manager.WaitTeardowns()
	return stack
}

func limits() runtime.Limits {
	return runtime.Limits{
		Timeout: 20 * time.Second, MemoryBytes: 256 << 20, CPUs: 1, Pids: 64,
		StdoutBytes: 64 << 10, StderrBytes: 64 << 10, WorkspaceBytes: 8 << 20, TmpBytes: 8 << 20,
	}
}

func run(t *testing.T, lang runtime.Language, code string, mut ...func(*runtime.Limits)) runtime.Result {
	t.Helper()
	s := need(t)
	l := limits()
	for _, f := range mut {
		f(&l)
	}
	res, err := s.Manager.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: l})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// The bounding set is a thread's, and the code starts from whichever of
// the driver's threads forks it: every thread of the driver (pid 1), not
// just the code, must have an empty one. With the drop made on one thread
// only, three of the driver's four kept four capabilities, and about one
// run in thirty started its code from one of them.
func TestEmptyBoundingSetOnEveryThread(t *testing.T) {
	r := run(t, runtime.Shell, "grep -h CapBnd /proc/self/status /proc/1/task/*/status")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if r.ExitCode != 0 || len(lines) < 2 {
		t.Fatalf("exit %d, output %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	for _, l := range lines {
		if l != "CapBnd:\t0000000000000000" {
			t.Errorf("a non-empty bounding set: %q (all: %q)", l, r.Stdout)
		}
	}
}

func TestSandboxBaseline(t *testing.T) {
	cases := []struct {
		name     string
		lang     runtime.Language
		code     string
		exit     int
		contains string // in stdout+stderr
	}{
		{"gvisor kernel", runtime.Python, "import platform; print(platform.release())", 0, "gvisor"},
		{"unprivileged user", runtime.Shell, "id -u; id -g", 0, "1000\n1000"},
		{"no capabilities", runtime.Shell, "grep CapEff /proc/self/status", 0, "0000000000000000"},
		{"no_new_privs", runtime.Shell, "grep NoNewPrivs /proc/self/status", 0, "NoNewPrivs:\t1"},
		{"read-only root", runtime.Python, "open('/var/tmp/x', 'w')", 1, "Read-only file system"},
		{"root mounted read-only", runtime.Shell, "awk '$2 == \"/\" { split($4, o, \",\"); print \"root:\" o[1] }' /proc/mounts", 0, "root:ro"},
		{"workspace is cwd and writable", runtime.Shell, "pwd; echo hi > f && cat f", 0, "/workspace\nhi"},
		{"workspace cap", runtime.Shell, "head -c 20M /dev/zero > /workspace/big", 1, "No space left on device"},
		{"tmp cap", runtime.Shell, "head -c 20M /dev/zero > /tmp/big", 1, "No space left on device"},
		{"only loopback", runtime.Shell, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", 0, "lo"},
		{"no dns", runtime.Python, "import socket\ntry: socket.getaddrinfo('pypi.org', 443)\nexcept OSError as e: print('nodns')", 0, "nodns"},
		{"exit code 3", runtime.Shell, "exit 3", 3, ""},
		{"exit code 42", runtime.Python, "raise SystemExit(42)", 42, ""},
		{"stdin is empty", runtime.Python, "import sys; print(repr(sys.stdin.read()))", 0, "''"},
		{"cwd imports work", runtime.Shell, "echo \"V = 5\" > m.py && python3 -c \"import m; print(m.V)\"", 0, "5"},
		{"shell script lines are not eaten by cat", runtime.Shell, "cat\necho after", 0, "after"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, c.lang, c.code)
			out := r.Stdout + r.Stderr
			if r.ExitCode != c.exit || !strings.Contains(out, c.contains) {
				t.Errorf("exit %d, output %q; want exit %d containing %q", r.ExitCode, out, c.exit, c.contains)
			}
			if c.name == "only loopback" && strings.TrimSpace(r.Stdout) != "lo" {
				t.Errorf("interfaces = %q, want only lo", r.Stdout)
			}
		})
	}
}

// The sandbox cannot reach the host: a listener of the test's own, on the
// host's own non-loopback addresses, counts zero connections.
func TestNoNetworkToHost(t *testing.T) {
	need(t)
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var hits atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			hits.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	addrs, _ := net.InterfaceAddrs()
	var targets []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			targets = append(targets, ipn.IP.String())
		}
	}
	if len(targets) == 0 {
		t.Skip("host has no non-loopback IPv4 address")
	}
	code := fmt.Sprintf("import socket\nfor h in %q.split():\n  s = socket.socket(); s.settimeout(2)\n  try:\n    s.connect((h, %d)); print('connected', h)\n  except OSError as e: print('failed', h, e.errno)", strings.Join(targets, " "), port)
	r := run(t, runtime.Python, code)
	if strings.Contains(r.Stdout, "connected") || !strings.Contains(r.Stdout, "failed") {
		t.Errorf("sandbox reached the host: %q %q", r.Stdout, r.Stderr)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("host listener saw %d connections from the sandbox", n)
	}
}

func TestEnvironmentIsAllowListed(t *testing.T) {
	t.Setenv("AIRLOCK_TEST_CANARY", "canary-7f3a")
	r := run(t, runtime.Shell, "env")
	if strings.Contains(r.Stdout, "canary-7f3a") || strings.Contains(r.Stdout, "AIRLOCK") {
		t.Fatalf("server environment visible in the sandbox:\n%s", r.Stdout)
	}
	if !strings.Contains(r.Stdout, "HOME=/workspace") {
		t.Errorf("env lacks HOME=/workspace:\n%s", r.Stdout)
	}
}

func TestTimeoutKillsWholeSandbox(t *testing.T) {
	cases := map[string]struct {
		lang runtime.Language
		code string
	}{
		"busy loop":           {runtime.Python, "while True: pass"},
		"ignores SIGTERM":     {runtime.Python, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"},
		"background children": {runtime.Shell, "trap '' TERM; (trap '' TERM; sleep 600) & setsid sleep 600 & sleep 600"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			r := run(t, c.lang, c.code, func(l *runtime.Limits) { l.Timeout = 2 * time.Second })
			took := time.Since(start)
			if !r.TimedOut || r.Reason != runtime.ReasonTimeout || !r.Failed() {
				t.Errorf("result %+v, want timed out", r)
			}
			if took > 4*time.Second {
				t.Errorf("took %v for a 2 s timeout", took)
			}
		})
	}
}

func TestMemoryLimit(t *testing.T) {
	for _, code := range []string{
		"x = []\nwhile True: x.append(bytearray(16 << 20))",
		// One allocation past the limit: the sandbox is killed at once,
		// and the run says so then, not at its timeout.
		"b = bytearray(400 << 20)\nprint('alive')",
	} {
		r := run(t, runtime.Python, code, func(l *runtime.Limits) { l.MemoryBytes = 128 << 20 })
		if !r.OOMKilled || r.Reason != runtime.ReasonOutOfMemory || !r.Failed() || r.TimedOut || r.Stdout != "" {
			t.Fatalf("%q: result %+v, want out of memory", code, r)
		}
	}
	// Under the limit the same allocation pattern works.
	r := run(t, runtime.Python, "x = [bytearray(16 << 20) for _ in range(3)]; print('ok')", func(l *runtime.Limits) { l.MemoryBytes = 256 << 20 })
	if r.ExitCode != 0 || r.OOMKilled {
		t.Fatalf("48 MiB under a 256 MiB limit failed: %+v", r)
	}
}

func TestPidsLimit(t *testing.T) {
	code := "import subprocess\nps = []\ntry:\n  for i in range(200): ps.append(subprocess.Popen(['sleep', '30']))\nexcept OSError as e: pass\nprint(len(ps))\nfor p in ps: p.kill()"
	r := run(t, runtime.Python, code, func(l *runtime.Limits) { l.Pids = 32 })
	var n int
	// The limit counts every process of the uid, python itself included.
	if _, err := fmt.Sscan(r.Stdout, &n); err != nil || n >= 32 || n < 25 {
		t.Fatalf("started %q processes under a pids limit of 32 (stderr %q)", r.Stdout, r.Stderr)
	}
	// A fork bomb is contained and the next call works.
	bomb := run(t, runtime.Shell, ":(){ :|:& };:", func(l *runtime.Limits) { l.Pids = 32; l.Timeout = 5 * time.Second })
	if bomb.Duration > 8*time.Second {
		t.Errorf("fork bomb ran %v", bomb.Duration)
	}
	if r := run(t, runtime.Python, "print(1)"); r.ExitCode != 0 || r.Stdout != "1\n" {
		t.Fatalf("call after fork bomb: %+v", r)
	}
}

func TestCPULimit(t *testing.T) {
	// Two busy threads for 2 s of wall time under half a core: the process
	// can get at most ~1 s of CPU.
	code := "import time, os\nt0, c0 = time.time(), os.times()\nn = 0\nwhile time.time() - t0 < 2: n += 1\nc1 = os.times()\nprint((c1.user + c1.system - c0.user - c0.system) / (time.time() - t0))"
	r := run(t, runtime.Python, code, func(l *runtime.Limits) { l.CPUs = 0.5 })
	var ratio float64
	if _, err := fmt.Sscan(r.Stdout, &ratio); err != nil {
		t.Fatalf("output %q %q", r.Stdout, r.Stderr)
	}
	if ratio > 0.75 {
		t.Errorf("CPU/wall ratio %.2f under a 0.5 CPU limit", ratio)
	}
}

func TestOutputCaps(t *testing.T) {
	r := run(t, runtime.Python, "import sys\nsys.stdout.write('o' * 5_000_000)\nsys.stderr.write('e' * 5_000_000)", func(l *runtime.Limits) {
		l.StdoutBytes, l.StderrBytes = 1000, 2000
	})
	if !r.StdoutTruncated || !r.StderrTruncated || r.Reason != runtime.ReasonOutputCapped {
		t.Fatalf("result flags %+v", r)
	}
	wantOut := strings.Repeat("o", 1000) + fmt.Sprintf(runtime.TruncationMarker, 1000)
	wantErr := strings.Repeat("e", 2000) + fmt.Sprintf(runtime.TruncationMarker, 2000)
	if r.Stdout != wantOut || r.Stderr != wantErr {
		t.Errorf("stdout %d bytes, stderr %d bytes; want exactly the cap plus the marker", len(r.Stdout), len(r.Stderr))
	}
	if r.ExitCode != 0 || r.Failed() {
		t.Errorf("a capped but successful run is not a failure: %+v", r.ExitCode)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	s := need(t)
	// Slots are held until a sandbox is destroyed: start from none held.
	s.Manager.WaitTeardowns()
	lim := s.Config.Limits.Concurrency
	var wg sync.WaitGroup
	started := make(chan struct{}, lim)
	for i := 0; i < lim; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := limits()
			started <- struct{}{}
			if _, err := s.Manager.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: "sleep 3", Limits: l}); err != nil {
				t.Errorf("run within the limit: %v", err)
			}
		}()
	}
	for i := 0; i < lim; i++ {
		<-started
	}
	// Every slot taken: wait for that state, not for a guess of how long.
	for deadline := time.Now().Add(30 * time.Second); s.Manager.Admission().InUse() < lim; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d slots taken after 30 s", s.Manager.Admission().InUse(), lim)
		}
	}
	t0 := time.Now()
	_, err := s.Manager.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: "true", Limits: limits()})
	if !errors.Is(err, runtime.ErrBusy) {
		t.Errorf("run past limits.concurrency=%d: err %v, want ErrBusy", lim, err)
	}
	if time.Since(t0) > 100*time.Millisecond {
		t.Errorf("busy answer took %v; it must not wait", time.Since(t0))
	}
	wg.Wait()
	s.Manager.WaitTeardowns()
}

func TestCancelKillsSandbox(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := s.Manager.Run(ctx, runtime.Request{Language: runtime.Shell, Code: "sleep 60", Limits: limits()})
	if !errors.Is(err, context.Canceled) || time.Since(t0) > 5*time.Second {
		t.Fatalf("err %v after %v; want cancelled promptly", err, time.Since(t0))
	}
	assertNoSandboxes(t, s)
}

func TestNoLeaksAfterManyRuns(t *testing.T) {
	s := need(t)
	codes := []string{"true", "exit 3", "echo out; echo err >&2", "sleep 5", "head -c 20M /dev/zero > /tmp/x"}
	for i := 0; i < 15; i++ {
		l := limits()
		l.Timeout = time.Second
		if _, err := s.Manager.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: codes[i%len(codes)], Limits: l}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	assertNoSandboxes(t, s)
}

// assertNoSandboxes fails when the test's own instance left a container,
// snapshot, rootfs mount, network namespace mount or fifo dir. What other
// airlock processes on this host hold (their pools, their runs) is theirs:
// only this instance's labels and names are looked at.
func assertNoSandboxes(t *testing.T, s *boot.Stack) {
	t.Helper()
	// Sandboxes are destroyed just after their run answers.
	s.Manager.WaitTeardowns()
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	own := fmt.Sprintf("labels.%q==%s", local.LabelInstance, s.Instance.ID)
	cs, err := s.Client.Containers(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		t.Errorf("container %s left behind", c.ID())
	}
	var snaps []string
	_ = s.Client.SnapshotService(local.Snapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		snaps = append(snaps, i.Name)
		return nil
	}, own)
	if len(snaps) > 0 {
		t.Errorf("snapshots left behind: %v", snaps)
	}
	// A sandbox's rootfs is mounted at .../airlock-RUN/rootfs under this
	// stack's daemon; a mount there whose container is gone is a leak (one
	// of a live container belongs to whoever holds it). Its network
	// namespace is mounted at /run/netns/airlock-INSTANCE-RUN.
	rootfs := func() map[string]string { // container id -> mount line
		out := map[string]string{}
		mounts, _ := os.ReadFile("/proc/mounts")
		for _, l := range strings.Split(string(mounts), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			if dir := f[1]; strings.HasPrefix(dir, s.Config.StateDir+"/") && strings.HasSuffix(dir, "/rootfs") {
				out[path.Base(path.Dir(dir))] = l
			} else if strings.Contains(dir, "airlock-"+s.Instance.ID) {
				out[dir] = l // this instance's network namespace
			}
		}
		return out
	}
	// Mounts first, containers second: a sandbox has its container before
	// its rootfs is mounted, so whatever is mounted now is listed below.
	suspects := rootfs()
	all, _ := s.Client.Containers(ctx)
	for _, c := range all {
		delete(suspects, c.ID())
	}
	// Still mounted after the listing: not someone's teardown in flight.
	now := rootfs()
	for id, l := range suspects {
		if _, ok := now[id]; ok && (strings.HasPrefix(id, "airlock-") || strings.HasPrefix(id, "/")) {
			t.Errorf("mount left behind: %s", l)
		}
	}
	fifos, _ := os.ReadDir(local.FIFODir(s.Config.StateDir, s.Instance.ID))
	if len(fifos) > 0 {
		t.Errorf("%d fifo dirs left behind", len(fifos))
	}
}

// An orphan is a sandbox whose owning instance died without cleaning up.
func TestOrphansOfDeadInstancesAreRemoved(t *testing.T) {
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	img, err := s.Client.GetImage(ctx, s.Config.Image)
	if err != nil {
		t.Fatal(err)
	}
	orphan := func(deployment string) string {
		t.Helper()
		id := "airlock-orphan-" + runtime.NewRunID()
		_, err := s.Client.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshotView(id, img),
			containerd.WithNewSpec(oci.WithImageConfig(img)),
			containerd.WithContainerLabels(map[string]string{local.LabelInstance: "deadbeef0000", local.LabelDeployment: deployment}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = removeContainer(s, id) })
		return id
	}
	id := orphan(s.Deployment)
	// Another deployment's sandbox of an instance this one does not know:
	// never this deployment's to remove (issue 14.5).
	theirs := orphan("0123456789ab")
	// A snapshot with no container: its server died between preparing it
	// and creating the container (a stdio client closing as the pool
	// warmed once left one that failed every later leak check).
	sn := s.Client.SnapshotService(local.Snapshotter)
	bare := func(deployment string) string {
		t.Helper()
		key := "airlock-wbare" + runtime.NewRunID()
		diffIDs, err := img.RootFS(ctx)
		if err != nil {
			t.Fatal(err)
		}
		parent := identity.ChainID(diffIDs).String()
		if _, err := sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{
			local.LabelInstance: "deadbeef0000", local.LabelDeployment: deployment, local.LabelPool: "warming"})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sn.Remove(context.WithoutCancel(ctx), key) })
		return key
	}
	bareOurs, bareTheirs := bare(s.Deployment), bare("0123456789ab")
	// A second instance starting up removes this deployment's orphan, and
	// leaves this instance's sandboxes and the other deployment's alone.
	other, err := boot.Up(context.Background(), s.Config, boot.NeedClient, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	other.Close(context.Background())
	if _, err := s.Client.LoadContainer(ctx, id); err == nil {
		t.Errorf("orphan %s survived", id)
	}
	if _, err := s.Client.LoadContainer(ctx, theirs); err != nil {
		t.Errorf("another deployment's sandbox %s was removed: %v", theirs, err)
	}
	if _, err := sn.Stat(ctx, bareOurs); err == nil {
		t.Errorf("snapshot %s of a dead instance, without a container, survived", bareOurs)
	}
	if _, err := sn.Stat(ctx, bareTheirs); err != nil {
		t.Errorf("another deployment's snapshot %s was removed: %v", bareTheirs, err)
	}
	if r := run(t, runtime.Python, "print(2)"); r.Stdout != "2\n" {
		t.Errorf("live instance broken after another's GC: %+v", r)
	}
}

// Regression: teardown's deadline used to start with the run, so a run
// longer than it failed and leaked its sandbox.
func TestRunLongerThanCleanupDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 32 s")
	}
	r := run(t, runtime.Shell, "sleep 32; echo done", func(l *runtime.Limits) { l.Timeout = 45 * time.Second })
	if r.ExitCode != 0 || r.Stdout != "done\n" || r.TimedOut {
		t.Fatalf("32 s run: %+v", r)
	}
	assertNoSandboxes(t, need(t))
}

// Regression: under gVisor a pipe may take part of a large write; output
// must still arrive whole.
func TestLargeWritesArriveWhole(t *testing.T) {
	code := "import sys\nsys.stdout.write('a' * 300_000)\nprint('B' * 100_000)\nprint('END')"
	r := run(t, runtime.Python, code, func(l *runtime.Limits) { l.StdoutBytes = 1 << 20 })
	want := strings.Repeat("a", 300_000) + strings.Repeat("B", 100_000) + "\nEND\n"
	if r.Stdout != want || r.Truncated() {
		t.Fatalf("got %d bytes (truncated=%v), want %d", len(r.Stdout), r.Truncated(), len(want))
	}
}

// Regression: code used to be piped in on stdin, at tens of KiB per second.
func TestLargeCodeRunsPromptly(t *testing.T) {
	var b strings.Builder
	for b.Len() < 1<<20-100 {
		b.WriteString("x = 1  # padding padding padding padding padding padding padding\n")
	}
	b.WriteString("print('ran', x)\n")
	start := time.Now()
	r := run(t, runtime.Python, b.String())
	if r.ExitCode != 0 || r.Stdout != "ran 1\n" {
		t.Fatalf("1 MiB program: %+v", r.Stderr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("1 MiB program took %v", d)
	}
}

func TestTracebackNamesUserLines(t *testing.T) {
	r := run(t, runtime.Python, "def f():\n    return 1 / 0\nf()")
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "line 2, in f") || strings.Contains(r.Stderr, "<string>") {
		t.Fatalf("traceback:\n%s", r.Stderr)
	}
}

func TestCodeFileIsReadOnly(t *testing.T) {
	r := run(t, runtime.Shell, "echo x >> \"$0\" && echo wrote")
	if strings.Contains(r.Stdout, "wrote") || r.ExitCode == 0 {
		t.Fatalf("the run could modify its own code file: %+v", r)
	}
}

func TestManyProcessesUnderDefaultPids(t *testing.T) {
	r := run(t, runtime.Shell, "for i in $(seq 60); do sleep 2 & done; wait; echo ok", func(l *runtime.Limits) { l.Pids = 128 })
	if r.ExitCode != 0 || r.Stdout != "ok\n" {
		t.Fatalf("60 processes under pids=128: %+v", r)
	}
}

// With containerd.address set, airlock uses that daemon and never stops it.
func TestExternalContainerd(t *testing.T) {
	s := need(t)
	if s.Daemon == nil {
		t.Skip("the suite itself runs against an external containerd")
	}
	cfg := s.Config
	cfg.Containerd.Address = s.Daemon.Address
	ext, err := boot.Up(context.Background(), cfg, boot.NeedManager, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if ext.Daemon != nil {
		t.Error("an embedded daemon was claimed although an address was configured")
	}
	res, err := ext.Manager.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: "echo ext", Limits: limits()})
	ext.Close(context.Background())
	if err != nil || res.Stdout != "ext\n" {
		t.Fatalf("run through the external daemon: %+v, %v", res, err)
	}
	if _, err := s.Client.Version(context.Background()); err != nil {
		t.Fatalf("closing an external-daemon stack stopped the daemon: %v", err)
	}
}

// removeContainer deletes container id and its snapshot, if they exist.
func removeContainer(s *boot.Stack, id string) error {
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	c, err := s.Client.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	return c.Delete(ctx, containerd.WithSnapshotCleanup)
}

// With runtime.directfs off (the default) the sandbox process on the host
// is not root: runsc runs it as nobody in a user namespace of its own, and
// the gofer opens files for it. With directfs it would be host uid 0.
func TestSandboxProcessIsNobodyOnHost(t *testing.T) {
	s := need(t)
	if s.Config.Runtime.DirectFS {
		t.Fatal("the test config has runtime.directfs on; the default must be off")
	}
	stop := startRun(t, s, context.Background(), runtime.Request{Language: runtime.Shell, Code: "echo up; sleep 60", Limits: limits()})
	defer stop()
	root := local.RunscRoot(s.Deployment)
	selfNS, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	pids, argvs := local.RunscProcs()
	for i, args := range argvs {
		joined := strings.Join(args, " ") + " "
		// The shim adds the containerd namespace to runsc's root.
		if filepath.Base(args[0]) != "runsc-sandbox" || !strings.Contains(joined, "--root="+root+"/") {
			continue
		}
		dir := fmt.Sprintf("/proc/%d", pids[i])
		status, err := os.ReadFile(filepath.Join(dir, "status"))
		ns, nsErr := os.Readlink(filepath.Join(dir, "ns", "user"))
		if err != nil || nsErr != nil {
			continue // it exited meanwhile
		}
		found++
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 5 && f[0] == "Uid:" && slices.Contains(f[1:], "0") {
				t.Errorf("sandbox process %s runs as host uid 0: %q", dir, line)
			}
		}
		if ns == selfNS {
			t.Errorf("sandbox process %s shares the host's user namespace %s", dir, ns)
		}
	}
	if found == 0 {
		t.Fatalf("no runsc-sandbox process under --root %s while the run was going", root)
	}
}

// Nothing a caller sends reaches the OCI spec's annotations, where runsc
// would honour dev.gvisor.flag.* (host-uds=all, for one) even without
// --allow-flag-override: the spec is built from the operator's policy
// alone. A call full of such strings runs, and its container's spec, read
// back from containerd while it runs, has no annotations at all.
func TestCallerCannotReachAnnotations(t *testing.T) {
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	runID := runtime.NewRunID()
	stop := startRun(t, s, ctx, runtime.Request{RunID: runID, Language: runtime.Shell,
		Code:   "# dev.gvisor.flag.host-uds=all\necho 'dev.gvisor.flag.network=host'; sleep 60",
		Limits: limits()})
	defer stop()
	cs, err := s.Client.Containers(ctx, fmt.Sprintf("labels.%q==%s", local.LabelRun, runID))
	if err != nil || len(cs) != 1 {
		t.Fatalf("the run's container: %d found, %v", len(cs), err)
	}
	spec, err := cs[0].Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Annotations) != 0 {
		t.Errorf("the sandbox's spec has annotations %v; want none", spec.Annotations)
	}
}

// startRun starts req and returns once its code has printed, with a func
// that cancels the run and waits for it to end.
func startRun(t *testing.T, s *boot.Stack, ctx context.Context, req runtime.Request) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	var once sync.Once
	req.Output = func(runtime.Stream, []byte) { once.Do(func() { close(started) }) }
	done := make(chan error, 1)
	go func() {
		_, err := s.Manager.Run(ctx, req)
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("the run ended before its output: %v", err)
	}
	return func() {
		cancel()
		<-done
	}
}

// Under gVisor a one-shot worker's report and its exit often reach the
// driver in one poll; the report must win, or the cell's display (and
// figures) would be lost now and then.
func TestDisplayNeverLostToTheExit(t *testing.T) {
	for i := range 20 {
		if res := run(t, runtime.Python, "6 * 7"); res.Rich == nil || res.Rich.Display != "42" || res.ExitCode != 0 {
			t.Fatalf("run %d: exit %d rich %+v; want display 42", i, res.ExitCode, res.Rich)
		}
	}
}
