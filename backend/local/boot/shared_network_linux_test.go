package boot

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/network"
)

// The last instance of a deployment out removes the bridge and firewall
// another instance brought up, even when its own config offers no network,
// and the deployment's parent cgroups; an instance that is not the last
// removes nothing.
func TestLastOutRemovesRecordedNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root under CI=true")
		}
		t.Skip("needs root")
	}
	const bridge, table = "airlockbt0", "airlock_boot_test"
	with := config.Defaults()
	with.StateDir = t.TempDir()
	with.Log.Level = "warn"
	with.Network.AllowDomains = []string{"allowed.test"}
	with.Network.Bridge, with.Network.Subnet, with.Network.Table = bridge, "10.89.250.0/24", table
	without := with
	without.Network.AllowDomains = nil
	if without.NetworkOffered() {
		t.Fatal("the second config offers a network")
	}
	ncfg := network.Config{Bridge: bridge, Subnet: netip.MustParsePrefix("10.89.250.0/24"), Table: table, StateDir: with.StateDir}
	nm, err := network.New(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever happens, this test's bridge and table go.
	t.Cleanup(func() {
		_ = nm.RemoveFirewall()
		_ = nm.RemoveBridge()
	})
	exists := func() (bridgeUp, tableUp bool) {
		bridgeUp = exec.Command("ip", "link", "show", bridge).Run() == nil
		tableUp = exec.Command("nft", "list", "table", "inet", table).Run() == nil
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := Up(ctx, with, NeedClient, log)
	if err != nil {
		t.Fatal(err)
	}
	// What a's first networked sandbox would have made.
	if err := nm.EnsureFirewall(); err != nil {
		a.Close(ctx)
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "link", "add", bridge, "type", "bridge").CombinedOutput(); err != nil {
		a.Close(ctx)
		t.Fatalf("add bridge: %v: %s", err, out)
	}
	b, err := Up(ctx, without, NeedClient, log)
	if err != nil {
		a.Close(ctx)
		t.Fatal(err)
	}
	// And a sandbox's parent cgroup, as a's first sandbox would have made.
	cg := filepath.Join("/sys/fs/cgroup/memory/airlock", a.Deployment)
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		cg = filepath.Join("/sys/fs/cgroup/airlock", a.Deployment) // cgroup v2
	}
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	a.Close(ctx)
	if br, tb := exists(); !br || !tb {
		t.Fatalf("after an instance that is not the last left: bridge %v, table %v; want both kept", br, tb)
	}
	b.Close(ctx)
	if br, tb := exists(); br || tb {
		t.Fatalf("after the last instance (no network of its own) left: bridge %v, table %v; want both removed", br, tb)
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("the deployment's cgroup %s is still there (%v)", cg, err)
	}
	if left, _ := filepath.Glob(filepath.Join(sharedNetworkDir(with.StateDir), "*")); len(left) > 0 {
		t.Fatalf("records left: %v", left)
	}
}
