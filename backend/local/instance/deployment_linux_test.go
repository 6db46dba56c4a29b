package instance

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestDeploymentIDStable(t *testing.T) {
	dir := t.TempDir()
	a, err := DeploymentID(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := DeploymentID(dir)
	if err != nil || a != b || !idRE.MatchString(a) {
		t.Fatalf("ids %q, %q (%v): want one stable id", a, b, err)
	}
	if c, _ := DeploymentID(t.TempDir()); c == a {
		t.Fatal("two state dirs got the same deployment id")
	}
	if err := os.WriteFile(dir+"/"+deploymentFile, []byte("../x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := DeploymentID(dir); err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Fatalf("a bad id file: %v", err)
	}
}

// A second deployment may share nothing with a live one; a dead one's
// registration lapses; instances of one deployment never clash.
func TestClaim(t *testing.T) {
	reg := t.TempDir()
	ctx := context.Background()
	a := Resources{StateDir: "/var/lib/a", Containerd: "/var/lib/a/containerd/containerd.sock", Namespace: "airlock", Bridge: "br-a", Subnet: "10.89.0.0/24", Table: "airlock", PID: 1}
	holdA, err := Claim(ctx, reg, "aaaaaaaaaaaa", "i1", a)
	if err != nil {
		t.Fatal(err)
	}
	other := Resources{StateDir: "/var/lib/b", Containerd: "/var/lib/b/containerd/containerd.sock", Namespace: "airlock", Bridge: "br-b", Subnet: "10.90.0.0/24", Table: "airlock_b"}
	for _, tc := range []struct {
		name string
		edit func(*Resources)
		key  string
	}{
		{"same bridge", func(r *Resources) { r.Bridge = "br-a" }, "network.bridge"},
		{"same table", func(r *Resources) { r.Table = "airlock" }, "network.table"},
		{"overlapping subnet", func(r *Resources) { r.Subnet = "10.89.0.128/25" }, "network.subnet"},
		{"same daemon and namespace", func(r *Resources) { r.Containerd = "unix://" + a.Containerd }, "containerd.namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := other
			tc.edit(&r)
			h, err := Claim(ctx, reg, "bbbbbbbbbbbb", "i2", r)
			var ce *ClashError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), "/var/lib/a") {
				_ = h.Close()
				t.Fatalf("claim: %v, want a clash naming %s and the other state_dir", err, tc.key)
			}
		})
	}
	// Distinct resources, and a second instance of A: both fine.
	holdB, err := Claim(ctx, reg, "bbbbbbbbbbbb", "i3", other)
	if err != nil {
		t.Fatal(err)
	}
	defer holdB.Close()
	// A second instance of A, with another bridge (a test stack beside a
	// server): its resources count as A's too.
	a2 := a
	a2.Bridge, a2.Table = "br-a2", "airlock_a2"
	holdA2, err := Claim(ctx, reg, "aaaaaaaaaaaa", "i4", a2)
	if err != nil {
		t.Fatalf("a second instance of a deployment: %v", err)
	}
	// A is live while either instance holds it; once both are gone its
	// bridge is free.
	r := other
	r.Containerd = "/var/lib/c/containerd.sock"
	_ = holdA.Close()
	r.Bridge = "br-a2"
	if _, err := Claim(ctx, reg, "cccccccccccc", "i5", r); err == nil || !strings.Contains(err.Error(), "network.bridge") {
		t.Fatal("the bridge of A's second instance taken while it lives")
	}
	_ = holdA2.Close()
	r.Table, r.Subnet = "airlock_c", "10.91.0.0/24"
	if h, err := Claim(ctx, reg, "cccccccccccc", "i6", r); err != nil {
		t.Fatalf("A's bridge after A left: %v", err)
	} else {
		_ = h.Close()
	}
}

// A guardian forgets its dead server's registration, never a live one's.
func TestForgetDead(t *testing.T) {
	reg := t.TempDir()
	ctx := context.Background()
	const dep, live, dead = "aaaaaaaaaaaa", "111111111111", "222222222222"
	r := Resources{StateDir: "/var/lib/a", Containerd: "/c.sock", Namespace: "airlock"}
	holdLive, err := Claim(ctx, reg, dep, live, r)
	if err != nil {
		t.Fatal(err)
	}
	defer holdLive.Close()
	holdDead, err := Claim(ctx, reg, dep, dead, r)
	if err != nil {
		t.Fatal(err)
	}
	// What a killed process leaves: the files, with no lock on them.
	_ = holdDead.f.Close()
	holdDead.f = nil

	ForgetDead(reg, dep, live)
	ForgetDead(reg, dep, dead)
	ForgetDead(reg, dep, "../../etc") // not an id: ignored
	for _, tc := range []struct {
		inst string
		want bool
	}{{live, true}, {dead, false}} {
		for _, ext := range []string{".json", ".lock"} {
			_, err := os.Stat(reg + "/" + dep + "." + tc.inst + ext)
			if got := err == nil; got != tc.want {
				t.Errorf("%s%s exists = %v, want %v", tc.inst, ext, got, tc.want)
			}
		}
	}
}
