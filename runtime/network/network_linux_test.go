package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/airlock-mcp/airlock/runtime/netns"
	"github.com/airlock-mcp/airlock/runtime/netns/netnstest"
)

// These tests need root, CNI plugins and nftables. Every name they create
// (bridge, subnet, nftables tables, instance IDs, namespaces) is unique to
// the test, so they never touch a real airlock installation's network. Every
// address they aim at ends on this machine.

func requireHost(t *testing.T) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("network tests need root")
	}
	for _, p := range []string{"bridge", "host-local"} {
		found := false
		for _, d := range DefaultCNIBinDirs {
			if _, err := os.Stat(filepath.Join(d, p)); err == nil {
				found = true
			}
		}
		if !found {
			skip("CNI plugin %s not found in %v (apt-get install containernetworking-plugins)", p, DefaultCNIBinDirs)
		}
	}
}

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

type testEnv struct {
	cfg Config
}

// newEnv picks a bridge, subnet and table of its own and removes them, and
// any attachment left, when the test ends.
func newEnv(t *testing.T) *testEnv {
	t.Helper()
	requireHost(t)
	suffix := randHex(t, 3)
	cfg := Config{
		Bridge:   "alt" + suffix,
		Subnet:   freeSubnet(t),
		StateDir: t.TempDir(),
		Table:    "airlock_t" + suffix,
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{cfg: m.Config()}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := m.GC(ctx, func(string) bool { return false }); err != nil {
			t.Errorf("cleanup gc: %v", err)
		}
		if err := m.RemoveBridge(); err != nil {
			t.Errorf("cleanup bridge: %v", err)
		}
		if err := m.RemoveFirewall(); err != nil {
			t.Errorf("cleanup firewall: %v", err)
		}
	})
	return env
}

func (e *testEnv) manager(t *testing.T, instanceID string) *Manager {
	t.Helper()
	cfg := e.cfg
	cfg.InstanceID = instanceID
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// freeSubnet returns a 10.89.x.0/24 that no host address or route overlaps.
func freeSubnet(t *testing.T) netip.Prefix {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 89, 100 + b[0]%150, 0}), 24)
		clash := false
		for _, r := range routes {
			if r.Dst != nil {
				if q, ok := netipPrefix(r.Dst); ok && q.Overlaps(p) && q.Bits() > 0 {
					clash = true
				}
			}
		}
		for _, a := range addrs {
			if q, ok := netipPrefix(a.IPNet); ok && q.Overlaps(p) {
				clash = true
			}
		}
		if !clash {
			return p
		}
	}
	t.Fatal("no free 10.89.x.0/24")
	return netip.Prefix{}
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

func attach(t *testing.T, m *Manager, runID string) *Attachment {
	t.Helper()
	att, err := m.Attach(context.Background(), runID)
	if err != nil {
		t.Fatalf("attach %s: %v", runID, err)
	}
	t.Cleanup(func() {
		if err := m.Detach(context.Background(), att); err != nil {
			t.Errorf("detach %s: %v", runID, err)
		}
	})
	return att
}

// dialFrom connects from namespace ns and reads the listener's greeting.
func dialFrom(ns, addr string) (string, error) {
	var got string
	err := netns.Do(ns, func() error {
		conn, err := net.DialTimeout("tcp4", addr, time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(conn)
		got = string(b)
		return err
	})
	return got, err
}

func sendUDPFrom(ns, addr string) error {
	return netns.Do(ns, func() error {
		conn, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		for range 3 {
			if _, err := conn.Write([]byte("query")); err != nil {
				return err
			}
		}
		return nil
	})
}

// pingFrom sends one ICMP echo from namespace ns and waits for the reply.
func pingFrom(ns string, dst netip.Addr) error {
	return netns.Do(ns, func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		id := os.Getpid() & 0xffff
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("airlock")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 1500)
		for {
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			rm, err := icmp.ParseMessage(1, buf[:n])
			if err == nil && rm.Type == ipv4.ICMPTypeEchoReply && peer.String() == dst.String() {
				return nil
			}
		}
	})
}

// waitCount waits until c has counted want, for positive controls.
func waitCount(t *testing.T, c *netnstest.Counter, want int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for c.Count() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.Count(); got != want {
		t.Fatalf("listener %s counted %d, want %d", c.Addr, got, want)
	}
}

// expectBlocked checks that an attempt from a sandbox failed and that the
// listener it aimed at saw nothing.
func expectBlocked(t *testing.T, what string, err error, c *netnstest.Counter) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: succeeded, want blocked", what)
	} else {
		t.Logf("%s: blocked: %v", what, err)
	}
	time.Sleep(100 * time.Millisecond)
	if c != nil && c.Count() != 0 {
		t.Errorf("%s: listener %s counted %d, want 0", what, c.Addr, c.Count())
	}
}

func readSysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// setSysctl sets key and restores its value when the test ends.
func setSysctl(t *testing.T, key, value string) {
	t.Helper()
	old := readSysctl(t, key)
	if err := netns.WriteSysctl(key, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.WriteSysctl(key, old) })
}

// hostAddr is an IPv4 address of this machine outside the test network.
func hostAddr(t *testing.T, e *testEnv) (netip.Addr, bool) {
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if name == "lo" || strings.HasPrefix(name, "alt") || strings.HasPrefix(name, "airlock") {
			continue
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if ok && ip.Unmap().IsGlobalUnicast() && !e.cfg.Subnet.Contains(ip.Unmap()) {
				return ip.Unmap(), true
			}
		}
	}
	return netip.Addr{}, false
}

var metaStandIn = netip.MustParseAddr("169.254.77.77")

// metadataStandIn builds a namespace that owns 169.254.77.77, reached from
// the host over a veth with a /32 route, and a listener on port 80 inside.
func metadataStandIn(t *testing.T, e *testEnv) *netnstest.Counter {
	t.Helper()
	return netnstest.StandIn{Dir: e.cfg.NetNSDir, Addr: metaStandIn, Port: 80}.Start(t)
}

func counters(t *testing.T, m *Manager) map[string]uint64 {
	t.Helper()
	c, err := m.DropCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func expectIncreased(t *testing.T, m *Manager, before map[string]uint64, names ...string) map[string]uint64 {
	t.Helper()
	after := counters(t, m)
	for _, n := range names {
		if after[n] <= before[n] {
			t.Errorf("drop counter %s: %d -> %d, want an increase", n, before[n], after[n])
		}
	}
	return after
}

func TestFirewallIdempotent(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, "")
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	n1, err := m.RuleCount()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	n2, err := m.RuleCount()
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, cs := range m.chains() {
		want += len(cs.rules)
	}
	if n1 != want || n2 != want {
		t.Fatalf("rule count %d then %d, want %d", n1, n2, want)
	}
	if err := m.checkFirewall(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nft", "list", "table", "inet", e.cfg.Table).CombinedOutput(); err == nil {
		t.Logf("nft list table inet %s:\n%s", e.cfg.Table, out)
	}
	if out, err := exec.Command("nft", "list", "table", "bridge", e.cfg.Table).CombinedOutput(); err == nil {
		t.Logf("nft list table bridge %s:\n%s", e.cfg.Table, out)
	}
	if err := m.RemoveFirewall(); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range []*nftables.Table{m.inetTable(), m.bridgeTable()} {
		if ok, err := tableExists(c, tb); err != nil || ok {
			t.Fatalf("table %s %s after RemoveFirewall: exists=%v err=%v", familyName(tb.Family), tb.Name, ok, err)
		}
	}
	if err := m.checkFirewall(); err == nil {
		t.Fatal("checkFirewall passed without tables")
	}
	if err := m.RemoveFirewall(); err != nil {
		t.Fatalf("second RemoveFirewall: %v", err)
	}
}

func TestAttachRefusedWithoutFirewall(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if _, err := m.Attach(context.Background(), "nofw"); err == nil {
		t.Fatal("attach without firewall succeeded")
	} else {
		t.Log(err)
	}
	assertNothingLeft(t, e, m)
}

// A failing CNI ADD (no plugins where it looks) must leave nothing behind.
func TestAttachFailureRollsBack(t *testing.T) {
	e := newEnv(t)
	cfg := e.cfg
	cfg.InstanceID = randHex(t, 4)
	cfg.CNIBinDirs = []string{t.TempDir()}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attach(context.Background(), "noplugins"); err == nil {
		t.Fatal("attach without CNI plugins succeeded")
	} else {
		t.Log(err)
	}
	assertNothingLeft(t, e, m)
}

// Cancelling Attach at any point either completes it or undoes it all.
func TestAttachCancelledMidway(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	for i := range 15 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*5*time.Millisecond)
		att, err := m.Attach(ctx, fmt.Sprintf("cancel-%d", i))
		cancel()
		if err == nil {
			ok++
			if err := m.Detach(context.Background(), att); err != nil {
				t.Fatal(err)
			}
		} else {
			failed++
		}
		assertNothingLeft(t, e, m)
	}
	t.Logf("%d attaches completed, %d cancelled", ok, failed)
}

func TestAttachCancelled(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Attach(ctx, "cancelled"); !errors.Is(err, context.Canceled) {
		t.Fatalf("attach with cancelled ctx: %v", err)
	}
	assertNothingLeft(t, e, m)
}

func TestIsolation(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	forward := readSysctl(t, "net/ipv4/ip_forward")
	a := attach(t, m, "sandbox-a")
	b := attach(t, m, "sandbox-b")
	if got := readSysctl(t, "net/ipv4/ip_forward"); got != forward {
		t.Errorf("ip_forward changed by attach: %s -> %s", forward, got)
	}
	gw := m.Config().Gateway()
	if a.Gateway != gw || !e.cfg.Subnet.Contains(a.IP) || a.IP == gw || a.IP == b.IP {
		t.Fatalf("attachments: %+v %+v", a, b)
	}
	t.Logf("gateway %s, A %s (%s), B %s (%s)", gw, a.IP, a.HostVeth, b.IP, b.HostVeth)

	// What the sandbox got: one address, no default route, no IPv6.
	err := netns.Do(a.NetNSPath, func() error {
		if v := readSysctl(t, "net/ipv6/conf/all/disable_ipv6"); v != "1" {
			return fmt.Errorf("disable_ipv6 in sandbox = %s", v)
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				return fmt.Errorf("sandbox has a default route: %+v", r)
			}
		}
		v6, err := netlink.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		if len(v6) != 0 {
			return fmt.Errorf("sandbox has IPv6 addresses: %v", v6)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	proxy := netnstest.ListenTCP(t, "", m.Config().ProxyAddr().String())
	other := netnstest.ListenTCP(t, "", netip.AddrPortFrom(gw, 8080).String())
	dns := netnstest.ListenUDP(t, "", netip.AddrPortFrom(gw, 53).String())
	inB := netnstest.ListenTCP(t, b.NetNSPath, netip.AddrPortFrom(b.IP, 9090).String())
	meta := metadataStandIn(t, e)
	var host *netnstest.Counter
	if ha, ok := hostAddr(t, e); ok {
		host = netnstest.ListenTCP(t, "", netip.AddrPortFrom(ha, 0).String())
	} else {
		t.Log("no host address outside the test network; skipping that check")
	}

	c0 := counters(t, m)

	t.Run("proxy reachable", func(t *testing.T) {
		for _, att := range []*Attachment{a, b} {
			got, err := dialFrom(att.NetNSPath, proxy.Addr)
			if err != nil || got != "ok" {
				t.Fatalf("sandbox %s -> proxy %s: %q %v", att.IP, proxy.Addr, got, err)
			}
		}
		waitCount(t, proxy, 2)
	})

	t.Run("gateway other port", func(t *testing.T) {
		before := counters(t, m)
		_, err := dialFrom(a.NetNSPath, other.Addr)
		expectBlocked(t, "sandbox -> "+other.Addr, err, other)
		if _, err := dialFrom("", other.Addr); err != nil {
			t.Fatalf("control: host -> %s: %v", other.Addr, err)
		}
		waitCount(t, other, 1)
		other.Reset()
		expectIncreased(t, m, before, CounterInputHost)
	})

	t.Run("icmp to gateway", func(t *testing.T) {
		before := counters(t, m)
		expectBlocked(t, "sandbox ping "+gw.String(), pingFrom(a.NetNSPath, gw), nil)
		expectIncreased(t, m, before, CounterInputHost)
	})

	t.Run("udp 53 to gateway", func(t *testing.T) {
		before := counters(t, m)
		if err := sendUDPFrom(a.NetNSPath, dns.Addr); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if dns.Count() != 0 {
			t.Fatalf("udp listener %s got %d datagrams from the sandbox", dns.Addr, dns.Count())
		}
		if err := sendUDPFrom("", dns.Addr); err != nil {
			t.Fatal(err)
		}
		waitCount(t, dns, 3)
		dns.Reset()
		expectIncreased(t, m, before, CounterInputHost)
	})

	t.Run("sandbox to sandbox", func(t *testing.T) {
		_, err := dialFrom(a.NetNSPath, inB.Addr)
		expectBlocked(t, "A -> B "+inB.Addr, err, inB)
		if _, err := dialFrom(b.NetNSPath, inB.Addr); err != nil {
			t.Fatalf("control: B -> itself: %v", err)
		}
		waitCount(t, inB, 1)
		inB.Reset()
		// Port isolation drops the frames before the bridge forward hook,
		// so the nftables counter moves only in "bridge layers" below.
	})

	t.Run("off-subnet without a route", func(t *testing.T) {
		_, err := dialFrom(a.NetNSPath, meta.Addr)
		expectBlocked(t, "sandbox -> metadata stand-in", err, meta)
		if host != nil {
			_, err := dialFrom(a.NetNSPath, host.Addr)
			expectBlocked(t, "sandbox -> host address "+host.Addr, err, host)
		}
	})

	expectIncreased(t, m, c0, CounterInputHost)

	// A sandbox cannot change its routes (no CAP_NET_ADMIN), but assume it
	// could, on a host where forwarding is on (as CNI's isGateway or Docker
	// would leave it): give A a default route via the gateway, and turn on
	// forwarding for packets arriving on this test bridge only. Every
	// address aimed at below still ends on this machine.
	t.Run("with a default route and forwarding", func(t *testing.T) {
		setSysctl(t, "net/ipv4/conf/"+e.cfg.Bridge+"/forwarding", "1")
		err := netns.Do(a.NetNSPath, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice(),
				Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
		})
		if err != nil {
			t.Fatal(err)
		}
		c1 := counters(t, m)
		_, err = dialFrom(a.NetNSPath, meta.Addr)
		expectBlocked(t, "sandbox -> metadata stand-in via gateway", err, meta)
		if _, err := dialFrom("", meta.Addr); err != nil {
			t.Fatalf("control: host -> %s: %v", meta.Addr, err)
		}
		waitCount(t, meta, 1)
		meta.Reset()
		c1 = expectIncreased(t, m, c1, CounterForwardFrom)
		if host != nil {
			_, err := dialFrom(a.NetNSPath, host.Addr)
			expectBlocked(t, "sandbox -> host address via gateway "+host.Addr, err, host)
			if _, err := dialFrom("", host.Addr); err != nil {
				t.Fatalf("control: host -> %s: %v", host.Addr, err)
			}
			waitCount(t, host, 1)
			host.Reset()
			expectIncreased(t, m, c1, CounterInputHost)
		}
		if got, err := dialFrom(a.NetNSPath, proxy.Addr); err != nil || got != "ok" {
			t.Fatalf("sandbox -> proxy: %q %v", got, err)
		}
	})

	// A takes B's address as a second one and talks to the proxy from it:
	// the bridge drops it (the port set allows A's port only A's address).
	t.Run("spoofed source address", func(t *testing.T) {
		before, accepted := counters(t, m), proxy.Count()
		err := netns.Do(a.NetNSPath, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: b.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		})
		if err != nil {
			t.Fatal(err)
		}
		err = netns.Do(a.NetNSPath, func() error {
			d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: b.IP.AsSlice()}}
			conn, err := d.Dial("tcp4", proxy.Addr)
			if err == nil {
				_ = conn.Close()
			}
			return err
		})
		expectBlocked(t, "A as B -> proxy", err, nil)
		if proxy.Count() != accepted {
			t.Errorf("proxy accepted a connection from a spoofed source")
		}
		after := counters(t, m)
		if after[CounterSpoofedIP]+after[CounterSpoofedARP] <= before[CounterSpoofedIP]+before[CounterSpoofedARP] {
			t.Errorf("spoof counters did not move: %v -> %v", before, after)
		}
		_ = netns.Do(a.NetNSPath, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrDel(l, &netlink.Addr{IPNet: &net.IPNet{IP: b.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		})
		if got, err := dialFrom(a.NetNSPath, proxy.Addr); err != nil || got != "ok" {
			t.Fatalf("A -> proxy from its own address afterwards: %q %v", got, err)
		}
	})

	// IPv6 is off in the sandbox; turn it back on there (as if the sandbox
	// could) and send to the link's all-nodes group: the frames never leave
	// the bridge and are dropped on the way to the host.
	t.Run("ipv6 from sandbox", func(t *testing.T) {
		before := counters(t, m)
		err := netns.Do(a.NetNSPath, func() error {
			for _, k := range []string{"net/ipv6/conf/eth0/accept_dad", "net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/eth0/disable_ipv6"} {
				v := "0"
				if err := netns.WriteSysctl(k, v); err != nil {
					return err
				}
			}
			time.Sleep(200 * time.Millisecond)
			conn, err := net.Dial("udp6", "[ff02::1%eth0]:9")
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte("hello"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		expectIncreased(t, m, before, CounterBridgeNonIP)
		_ = netns.Do(a.NetNSPath, func() error { return netns.WriteSysctl("net/ipv6/conf/all/disable_ipv6", "1") })
	})

	t.Logf("drop counters: %v", counters(t, m))

	// Each layer of sandbox-to-sandbox isolation alone, then neither (a
	// control: the test can tell blocked from broken).
	t.Run("bridge layers", func(t *testing.T) {
		setIsolated := func(on bool) {
			for _, v := range []string{a.HostVeth, b.HostVeth} {
				l, err := netlink.LinkByName(v)
				if err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkSetIsolated(l, on); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Cleanup(func() { setIsolated(true) })
		c2 := counters(t, m)
		setIsolated(false)
		_, err := dialFrom(a.NetNSPath, inB.Addr)
		expectBlocked(t, "A -> B, nftables bridge rule only", err, inB)
		expectIncreased(t, m, c2, CounterBridgeFwd)

		// With br_netfilter loaded and bridge-nf-call-iptables=1 (as on
		// this VM), bridged IPv4 also passes the inet forward chain, a third
		// layer; flush it too so port isolation is tested alone. A has no
		// forwarding (the sysctl was restored) and aims only at B.
		setIsolated(true)
		flushChain(t, m.bridgeTable(), chainForward)
		flushChain(t, m.inetTable(), chainForward)
		t.Cleanup(func() {
			if err := m.EnsureFirewall(); err != nil {
				t.Errorf("restore firewall: %v", err)
			}
		})
		_, err = dialFrom(a.NetNSPath, inB.Addr)
		expectBlocked(t, "A -> B, port isolation only", err, inB)

		setIsolated(false)
		// A remembers B as unreachable (a FAILED neighbour entry): forget it.
		if err := netns.Do(a.NetNSPath, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: b.IP.AsSlice()})
		}); err != nil {
			t.Logf("forget neighbour: %v", err)
		}
		if _, err := dialFrom(a.NetNSPath, inB.Addr); err != nil {
			t.Fatalf("control: A -> B with both layers off: %v (counters %v)", err, counters(t, m))
		}
		waitCount(t, inB, 1)
		inB.Reset()
		setIsolated(true)
		if err := m.EnsureFirewall(); err != nil {
			t.Fatal(err)
		}
		_, err = dialFrom(a.NetNSPath, inB.Addr)
		expectBlocked(t, "A -> B, both layers back", err, inB)
	})

	// EnsureFirewall ran again above: the port set kept its entries, so the
	// sandboxes still reach the proxy.
	for _, att := range []*Attachment{a, b} {
		if got, err := dialFrom(att.NetNSPath, proxy.Addr); err != nil || got != "ok" {
			t.Errorf("after EnsureFirewall again: %s -> proxy: %q %v", att.IP, got, err)
		}
	}
}

func flushChain(t *testing.T, tb *nftables.Table, chain string) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.FlushChain(&nftables.Chain{Name: chain, Table: tb})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// assertNothingLeft checks that m's instance has no namespace, record,
// address allocation, CNI cache entry or bridge port left.
func assertNothingLeft(t *testing.T, e *testEnv, m *Manager, keep ...*Attachment) {
	t.Helper()
	prefix := "airlock-" + m.Config().InstanceID + "-"
	if ents, err := os.ReadDir(e.cfg.NetNSDir); err == nil {
		for _, d := range ents {
			if strings.HasPrefix(d.Name(), prefix) {
				t.Errorf("netns left: %s", d.Name())
			}
		}
	}
	if ents, err := os.ReadDir(e.cfg.recordDir()); err == nil {
		for _, d := range ents {
			if strings.HasPrefix(d.Name(), prefix) {
				t.Errorf("record left: %s", d.Name())
			}
		}
	}
	if ents, err := os.ReadDir(e.cfg.allocDir()); err == nil {
		for _, d := range ents {
			owner := allocOwner(filepath.Join(e.cfg.allocDir(), d.Name()))
			if _, err := netip.ParseAddr(d.Name()); err == nil && strings.HasPrefix(owner, prefix) {
				t.Errorf("host-local allocation left: %s (owner %s)", d.Name(), owner)
			}
		}
	}
	if ents, err := os.ReadDir("/var/lib/cni/results"); err == nil {
		for _, d := range ents {
			if strings.Contains(d.Name(), prefix) {
				t.Errorf("CNI cache entry left: %s", d.Name())
			}
		}
	}
	if ports, err := m.portEntries(); err == nil {
		for veth, ip := range ports {
			kept := false
			for _, k := range keep {
				kept = kept || k.HostVeth == veth
			}
			if !kept {
				t.Errorf("port set entry left: %s . %s", veth, ip)
			}
		}
	}
	if br, err := netlink.LinkByName(e.cfg.Bridge); err == nil {
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			kept := false
			for _, k := range keep {
				kept = kept || k.HostVeth == l.Attrs().Name
			}
			if l.Attrs().MasterIndex == br.Attrs().Index && !kept {
				t.Errorf("bridge port left: %s", l.Attrs().Name)
			}
		}
	}
}

func TestDetachLeavesNothing(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	att, err := m.Attach(ctx, "once")
	if err != nil {
		t.Fatal(err)
	}
	alloc := filepath.Join(e.cfg.allocDir(), att.IP.String())
	if owner := allocOwner(alloc); owner != att.Name {
		t.Fatalf("allocation %s owned by %q, want %q", alloc, owner, att.Name)
	}
	veth, err := netlink.LinkByName(att.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if ports, err := m.portEntries(); err != nil || ports[att.HostVeth] != att.IP {
		t.Errorf("port set: %v %v, want %s . %s", ports, err, att.HostVeth, att.IP)
	}
	if pi, err := netlink.LinkGetProtinfo(veth); err != nil || !pi.Isolated {
		t.Errorf("bridge port %s not isolated: %+v %v", att.HostVeth, pi, err)
	}
	if _, err := os.Stat(att.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Attach(ctx, "once"); err == nil {
		t.Fatal("second attach of the same run succeeded")
	}
	if err := m.Detach(ctx, att); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(att.NetNSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns %s still there: %v", att.NetNSPath, err)
	}
	if _, err := netlink.LinkByName(att.HostVeth); err == nil {
		t.Errorf("veth %s still there", att.HostVeth)
	}
	if _, err := os.Stat(alloc); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("allocation %s still there: %v", alloc, err)
	}
	if err := m.Detach(ctx, att); err != nil {
		t.Fatalf("second detach: %v", err)
	}
	assertNothingLeft(t, e, m)

	start := time.Now()
	for i := range 20 {
		att, err := m.Attach(ctx, fmt.Sprintf("cycle-%d", i))
		if err != nil {
			t.Fatalf("cycle %d attach: %v", i, err)
		}
		if err := m.Detach(ctx, att); err != nil {
			t.Fatalf("cycle %d detach: %v", i, err)
		}
	}
	t.Logf("20 attach/detach cycles: %v", time.Since(start))
	assertNothingLeft(t, e, m)
}

func TestConcurrentAttach(t *testing.T) {
	e := newEnv(t)
	m := e.manager(t, randHex(t, 4))
	if err := m.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	const n = 8
	atts := make([]*Attachment, n)
	errs := make([]error, n)
	dup := make(chan error, 1)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			atts[i], errs[i] = m.Attach(context.Background(), fmt.Sprintf("par-%d", i))
		}()
	}
	// The same run twice at once: exactly one wins.
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := m.Attach(context.Background(), "par-0")
		dup <- err
	}()
	wg.Wait()
	dupErr := <-dup
	seen := map[netip.Addr]bool{}
	for i := range n {
		if errs[i] != nil {
			if i == 0 && dupErr == nil {
				continue // the duplicate won the race
			}
			t.Fatalf("attach %d: %v", i, errs[i])
		}
		if seen[atts[i].IP] {
			t.Fatalf("address %s handed out twice", atts[i].IP)
		}
		seen[atts[i].IP] = true
	}
	if errs[0] == nil && dupErr == nil {
		t.Fatal("the same run attached twice")
	}
	if _, err := os.Stat(filepath.Join(e.cfg.NetNSDir, netnsName(m.Config().InstanceID, "par-0"))); err != nil {
		t.Fatalf("winner of the duplicate race lost its netns: %v", err)
	}
	for i := range n {
		if atts[i] != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := m.Detach(context.Background(), atts[i]); err != nil {
					t.Errorf("detach %d: %v", i, err)
				}
			}()
		}
	}
	wg.Wait()
	if dupErr == nil {
		_ = m.GC(context.Background(), func(string) bool { return false })
	}
	assertNothingLeft(t, e, m)
}

func TestGC(t *testing.T) {
	e := newEnv(t)
	deadID, liveID := "dead"+randHex(t, 4), "live"+randHex(t, 4)
	dead, live := e.manager(t, deadID), e.manager(t, liveID)
	if err := live.EnsureFirewall(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gone, err := dead.Attach(ctx, "crashed")
	if err != nil {
		t.Fatal(err)
	}
	// A crash between creating the namespace and CNI ADD: record and
	// namespace, nothing else.
	strayName := netnsName(deadID, "stray")
	if err := dead.claimRecord(record{Name: strayName, InstanceID: deadID, RunID: "stray",
		NetNSPath: filepath.Join(e.cfg.NetNSDir, strayName)}); err != nil {
		t.Fatal(err)
	}
	stray, err := netns.Create(e.cfg.NetNSDir, strayName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(stray) })
	// Someone else's namespace that merely looks like ours.
	foreign, err := netns.Create(e.cfg.NetNSDir, "airlock-inet-"+randHex(t, 3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(foreign) })
	kept := attach(t, live, "running")
	// An attachment whose namespace and record are gone but whose address
	// is still allocated (a crash in the middle of Detach).
	half, err := dead.Attach(ctx, "half-detached")
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Delete(half.NetNSPath); err != nil {
		t.Fatal(err)
	}
	if err := dead.removeRecord(half.Name); err != nil {
		t.Fatal(err)
	}
	halfAlloc := filepath.Join(e.cfg.allocDir(), half.IP.String())
	if allocOwner(halfAlloc) != half.Name {
		t.Fatalf("allocation %s not owned by %s", halfAlloc, half.Name)
	}

	alive := func(id string) bool { return id == liveID }
	if err := live.GC(ctx, alive); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{gone.NetNSPath, stray, halfAlloc, filepath.Join(e.cfg.allocDir(), gone.IP.String()), live.recordPath(gone.Name)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived GC: %v", p, err)
		}
	}
	if _, err := netlink.LinkByName(gone.HostVeth); err == nil {
		t.Errorf("veth %s survived GC", gone.HostVeth)
	}
	assertNothingLeft(t, e, dead, kept)
	for _, p := range []string{foreign, kept.NetNSPath, filepath.Join(e.cfg.allocDir(), kept.IP.String()), live.recordPath(kept.Name)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("live instance's %s removed by GC: %v", p, err)
		}
	}
	if err := live.GC(ctx, alive); err != nil {
		t.Fatalf("second GC: %v", err)
	}
}
