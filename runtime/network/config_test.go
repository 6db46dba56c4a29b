package network

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c, err := Config{StateDir: "/var/lib/airlock"}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "airlock0" || c.Subnet != netip.MustParsePrefix("10.89.0.0/24") || c.ProxyPort != 3128 ||
		c.Table != "airlock" || c.NetNSDir != "/run/netns" || len(c.CNIBinDirs) != 2 {
		t.Fatalf("defaults: %+v", c)
	}
	if got := c.Gateway(); got != netip.MustParseAddr("10.89.0.1") {
		t.Fatalf("gateway %s", got)
	}
	if got := c.ProxyAddr().String(); got != "10.89.0.1:3128" {
		t.Fatalf("proxy addr %s", got)
	}
}

func TestConfigInvalid(t *testing.T) {
	for _, c := range []Config{
		{},                // no state dir
		{StateDir: "rel"}, // relative
		{StateDir: "/s", Bridge: "waytoolongbridgename"},
		{StateDir: "/s", Subnet: netip.MustParsePrefix("fd00::/64")},
		{StateDir: "/s", Subnet: netip.MustParsePrefix("10.0.0.1/24")},
		{StateDir: "/s", Subnet: netip.MustParsePrefix("10.0.0.0/31")},
		{StateDir: "/s", ProxyPort: 70000},
		{StateDir: "/s", InstanceID: "has-dash"},
		{StateDir: "/s", Table: "bad name"},
	} {
		if _, err := c.WithDefaults(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

func TestNetnsName(t *testing.T) {
	n := netnsName("abc123", "run-1.x")
	if n != "airlock-abc123-run-1.x" {
		t.Fatal(n)
	}
	inst, run, ok := parseNetnsName(n)
	if !ok || inst != "abc123" || run != "run-1.x" {
		t.Fatal(inst, run, ok)
	}
	for _, bad := range []string{"other-abc-run", "airlock-abc", "airlock--run", "airlock-ABC-run", "airlock-test-meta/x"} {
		if _, _, ok := parseNetnsName(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestConfList(t *testing.T) {
	c, err := Config{StateDir: "/state"}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.confList()
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Name    string
		Plugins []map[string]any
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	p := v.Plugins[0]
	if p["type"] != "bridge" || p["bridge"] != "airlock0" || p["ipMasq"] != false || p["isGateway"] != false || p["isDefaultGateway"] != false {
		t.Fatalf("bridge plugin: %s", b)
	}
	ipam := p["ipam"].(map[string]any)
	if ipam["type"] != "host-local" || ipam["dataDir"] != "/state/ipam" || len(ipam["routes"].([]any)) != 0 {
		t.Fatalf("ipam: %s", b)
	}
	if !strings.Contains(string(b), `"gateway":"10.89.0.1"`) {
		t.Fatalf("gateway missing: %s", b)
	}
}
