package daemon

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

	if err := da.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	if ping(ctx, db.Address) != nil {
		t.Fatal("daemon stopped while another instance still uses it")
	}

	if err := db.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if processAlive(pid) {
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
	if err := d.Release(ctx, self.ID); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Fatal("daemon kept alive by a dead instance")
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
