package daemon

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/backend/local/instance"
)

func needContainerd(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("containerd")
	if err == nil && os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("containerd and root are required under CI=true (run scripts/install-deps.sh): lookpath err %v, euid %d", err, os.Geteuid())
	}
	t.Skip("needs root and containerd")
}

// Two airlock processes share one embedded daemon; it stops only when the
// last live instance leaves.
func TestSharedDaemonLifecycle(t *testing.T) {
	needContainerd(t)
	ctx := context.Background()
	dir := t.TempDir()
	o := Options{StateDir: dir, Binary: "containerd", Log: slog.Default()}

	a, err := instance.Register(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := instance.Register(dir)
	if err != nil {
		t.Fatal(err)
	}
	da, err := Acquire(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	pid := da.pid()
	if pid == 0 {
		t.Fatal("no daemon pid after Acquire")
	}
	db, err := Acquire(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if db.pid() != pid {
		t.Fatalf("second instance started its own daemon (%d, want %d)", db.pid(), pid)
	}

	if err := a.Leave(ctx, stopper(t, da)); err != nil {
		t.Fatal(err)
	}
	if ping(ctx, db.Address) != nil {
		t.Fatal("daemon stopped while another instance still uses it")
	}

	if err := b.Leave(ctx, stopper(t, db)); err != nil {
		t.Fatal(err)
	}
	if ProcessAlive(pid) {
		t.Fatalf("daemon %d still running after the last instance left", pid)
	}
}

// A crashed instance (its lock dropped) does not keep the daemon alive.
func TestDeadInstanceDoesNotHoldDaemon(t *testing.T) {
	needContainerd(t)
	ctx := context.Background()
	dir := t.TempDir()
	o := Options{StateDir: dir, Binary: "containerd", Log: slog.Default()}
	self, _ := instance.Register(dir)
	defer self.Close()
	// What a SIGKILLed instance leaves: its file, with no lock held on it.
	if err := os.WriteFile(filepath.Join(dir, "instances", "deadbeef0000.lock"), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := Acquire(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	pid := d.pid()
	if err := self.Leave(ctx, stopper(t, d)); err != nil {
		t.Fatal(err)
	}
	if ProcessAlive(pid) {
		t.Fatal("daemon kept alive by a dead instance")
	}
}

// stopper is what boot runs when the last instance leaves.
func stopper(t *testing.T, d *Daemon) func(context.Context) {
	return func(ctx context.Context) {
		if err := d.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
}

// Instances leaving at the same moment: exactly one sees itself last, so
// the daemon is stopped, not left running by both thinking the other stays.
func TestSimultaneousLeaveStopsDaemon(t *testing.T) {
	needContainerd(t)
	ctx := context.Background()
	dir := t.TempDir()
	o := Options{StateDir: dir, Binary: "containerd", Log: slog.Default()}
	const n = 4
	insts := make([]*instance.Instance, n)
	var d *Daemon
	for i := range insts {
		var err error
		if insts[i], err = instance.Register(dir); err != nil {
			t.Fatal(err)
		}
		if d, err = Acquire(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	pid := d.pid()
	var stops atomic.Int32
	var wg sync.WaitGroup
	for _, inst := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = inst.Leave(ctx, func(ctx context.Context) { stops.Add(1); _ = d.Stop(ctx) })
		}()
	}
	wg.Wait()
	if got := stops.Load(); got != 1 {
		t.Errorf("last-out ran %d times, want exactly 1", got)
	}
	if ProcessAlive(pid) {
		t.Errorf("daemon %d still running after every instance left", pid)
	}
}

func TestConfigIsPrivate(t *testing.T) {
	c := Config("/s/containerd", "/s/containerd/containerd.sock")
	for _, want := range []string{`root = "/s/containerd/root"`, `state = "/s/containerd/state"`, `address = "/s/containerd/containerd.sock"`, `"io.containerd.grpc.v1.cri"`} {
		if !strings.Contains(c, want) {
			t.Errorf("config lacks %s:\n%s", want, c)
		}
	}
}

// An instance whose shared daemon another instance restarted between two
// of its pings hears of it (down, then up) as if it had restarted it
// itself: its sandboxes' exit waits broke all the same. It used to hear
// nothing, and kept sandboxes whose teardown then failed.
func TestSupervisorHearsRestartByAnother(t *testing.T) {
	needContainerd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	o := Options{StateDir: dir, Binary: "containerd", Log: slog.Default()}
	inst, err := instance.Register(dir)
	if err != nil {
		t.Fatal(err)
	}
	da, err := Acquire(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Leave(context.Background(), stopper(t, da)) })
	db, err := Acquire(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	old := da.pid()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ProcessAlive(old); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("containerd %d outlived SIGKILL for 10 s", old)
		}
	}
	// a restarts it before b has pinged even once.
	if err := da.restart(ctx); err != nil {
		t.Fatal(err)
	}
	if p := da.pid(); p == 0 || p == old {
		t.Fatalf("after the restart: pid %d (was %d)", p, old)
	}
	var downs, ups atomic.Int32
	go db.Supervise(ctx, func() { downs.Add(1) }, func() {
		if downs.Load() == 0 {
			t.Error("up before down")
		}
		ups.Add(1)
	})
	for deadline := time.Now().Add(10 * time.Second); ups.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b never heard of the restart")
		}
	}
	cancel()
	if d, u := downs.Load(), ups.Load(); d != 1 || u != 1 {
		t.Fatalf("b heard down %d, up %d times; want once each", d, u)
	}
}
