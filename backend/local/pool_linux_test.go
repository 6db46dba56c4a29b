package local_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/runtime"
)

// managerOptions are the options of a second manager on the test stack,
// logging at level.
func managerOptions(t *testing.T, s *boot.Stack, level slog.Level) local.Options {
	t.Helper()
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	img, err := s.Client.GetImage(ctx, s.Config.Image)
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.ManagerOptions(img, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err != nil {
		t.Fatal(err)
	}
	o.Shim = s.Shim
	return o
}

// startManager starts a second manager on the test stack with options o;
// the test's cleanup closes it and checks that no sandbox is left.
func startManager(t *testing.T, s *boot.Stack, ctx context.Context, o local.Options) *local.ContainerdManager {
	t.Helper()
	m, err := local.NewContainerd(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		assertNoSandboxes(t, s)
	})
	return m
}

// poolManager starts a second manager on the test stack with a warm pool of
// size n, and waits until it is full. With restore, its sandboxes are
// restored from a template (but the first, which boots while the template
// is made).
func poolManager(t *testing.T, n, concurrency int, restore ...bool) *local.ContainerdManager {
	t.Helper()
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	o := managerOptions(t, s, slog.LevelWarn)
	o.Concurrency, o.Queue = concurrency, 0
	o.Restore = len(restore) > 0 && restore[0]
	o.PoolSize, o.PoolLimits, o.PoolMaxIdle = n, s.Config.Limits.RunLimits(0), time.Hour
	m := startManager(t, s, ctx, o)
	waitReady(t, m, n)
	return m
}

func waitReady(t *testing.T, m *local.ContainerdManager, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if ready, _ := m.Pool().Ready(); ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool did not fill to %d in 3 minutes", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func poolRun(t *testing.T, m *local.ContainerdManager, lang runtime.Language, code string) runtime.Result {
	t.Helper()
	r, err := m.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: need(t).Config.Limits.RunLimits(0)})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

// What a program can see of its sandbox, printed so two runs compare as
// text: user, groups, capabilities, limits, environment, working
// directory, mounts and their sizes, hostname, network interfaces, the code
// file and its directory, argv, and its open file descriptors.
const probe = `import os, sys, resource, socket
print("ids", os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups()))
for l in open("/proc/self/status"):
    if l.split(":")[0] in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
        print(l.strip())
for r in ("RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_AS", "RLIMIT_STACK"):
    print(r, resource.getrlimit(getattr(resource, r)))
print("env", sorted(os.environ.items()))
print("cwd", os.getcwd(), "argv", sys.argv, "file", __file__, "path", sys.path[:2])
for l in sorted(open("/proc/mounts")):
    print("mount", l.split()[1], l.split()[2], ",".join(o for o in sorted(l.split()[3].split(",")) if not o.startswith("size") or True))
for d in ("/workspace", "/tmp", "/.airlock", "/dev/shm"):
    st = os.statvfs(d)
    print("fs", d, st.f_blocks * st.f_frsize, oct(os.stat(d).st_mode), os.stat(d).st_uid)
print("airlock", sorted(os.listdir("/.airlock")), oct(os.stat("/.airlock/main.py").st_mode))
print("host", socket.gethostname(), sorted(l.split(":")[0].strip() for l in list(open("/proc/net/dev"))[2:]))
print("fds", sorted(os.listdir("/proc/self/fd")))
print("stdin", repr(sys.stdin.read()))
`

func TestPoolIsIndistinguishable(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(map[bool]string{false: "booted", true: "restored"}[restore], func(t *testing.T) {
			poolIsIndistinguishable(t, restore)
		})
	}
}

func poolIsIndistinguishable(t *testing.T, restore bool) {
	m := poolManager(t, 1, 4, restore)
	if restore {
		// The first pooled sandbox boots while the template is made; the
		// next is restored.
		if !local.WaitTemplate(m, 3*time.Minute) {
			t.Fatal("no template")
		}
		poolRun(t, m, runtime.Shell, "true")
		waitReady(t, m, 1)
		if local.Restored(m) == 0 {
			t.Fatal("the pool refilled by booting")
		}
	}
	warm := poolRun(t, m, runtime.Python, probe)
	if !warm.Warm {
		t.Fatal("the first run after the pool filled was not warm")
	}
	cold, err := need(t).Manager.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: probe, Limits: need(t).Config.Limits.RunLimits(0)})
	if err != nil {
		t.Fatal(err)
	}
	if cold.Warm || cold.ExitCode != 0 || warm.ExitCode != 0 {
		t.Fatalf("probe failed: cold %+v warm %+v", cold, warm)
	}
	if cold.Stdout != warm.Stdout {
		t.Errorf("a warm sandbox sees other than a cold one:\n%s", lineDiff(cold.Stdout, warm.Stdout, "cold", "warm"))
	}
	// The one documented difference: numpy and pandas are already imported.
	waitReady(t, m, 1)
	r := poolRun(t, m, runtime.Python, "import sys; print('numpy' in sys.modules, 'pandas' in sys.modules)")
	if !r.Warm || r.Stdout != "True True\n" {
		t.Errorf("warm preload: %+v", r)
	}
}

func TestPoolShellAndRefill(t *testing.T) {
	m := poolManager(t, 2, 4)
	r := poolRun(t, m, runtime.Shell, "echo $0; id -u; exit 7")
	if !r.Warm || r.ExitCode != 7 || r.Stdout != "/.airlock/main.sh\n1000\n" {
		t.Fatalf("warm shell run: %+v", r)
	}
	r = poolRun(t, m, runtime.Python, "import pandas as pd\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())")
	if !r.Warm || r.Stdout != "6\n" {
		t.Fatalf("warm pandas run: %+v", r)
	}
	// Both were destroyed after use, and the pool fills again.
	waitReady(t, m, 2)
	r = poolRun(t, m, runtime.Python, "raise SystemExit(3)")
	if !r.Warm || r.ExitCode != 3 {
		t.Fatalf("warm exit status: %+v", r)
	}
	// A warm run is bounded like a cold one: the timeout kills its sandbox.
	waitReady(t, m, 1)
	lim := need(t).Config.Limits.RunLimits(0)
	lim.Timeout = 2 * time.Second
	r, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print('spin', flush=True)\nwhile True: pass", Limits: lim})
	if err != nil || !r.Warm || !r.TimedOut || r.Stdout != "spin\n" || r.Duration > 4*time.Second {
		t.Fatalf("warm timeout: %+v, %v", r, err)
	}
}

// While every slot is taken by live runs the pool does not fill: warming
// would take their CPU.
func TestPoolYieldsToLiveRuns(t *testing.T) {
	m := poolManager(t, 1, 1)
	done := make(chan runtime.Result, 1)
	go func() { done <- poolRun(t, m, runtime.Shell, "sleep 4; echo done") }()
	time.Sleep(3 * time.Second)
	if ready, _ := m.Pool().Ready(); ready != 0 {
		t.Errorf("pool refilled while the only slot was busy: %d ready", ready)
	}
	if r := <-done; !r.Warm || r.Stdout != "done\n" {
		t.Fatalf("run: %+v", r)
	}
	waitReady(t, m, 1)
}
