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
	"testing"

	"github.com/airlock-mcp/airlock/runtime/instance"
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
