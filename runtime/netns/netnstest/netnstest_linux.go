// Package netnstest holds a network test's own witnesses: listeners that
// count what reaches them, in any namespace, and stand-in hosts routed into
// a namespace the test creates, so that a probe of "the metadata address"
// never leaves the machine. Imported by tests only.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/runtime/netns"
)

// Counter is a listener of the test's that counts what reaches it, in all
// and by source address.
type Counter struct {
	Addr string // host:port it listens on
	n    atomic.Int64
	mu   sync.Mutex
	from map[string]int64
}

func newCounter(addr net.Addr) *Counter {
	return &Counter{Addr: addr.String(), from: map[string]int64{}}
}

func (c *Counter) add(src net.Addr) {
	c.n.Add(1)
	host, _, _ := net.SplitHostPort(src.String())
	c.mu.Lock()
	c.from[host]++
	c.mu.Unlock()
}

// Count is the number of connections (TCP) or datagrams (UDP) seen so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// From is how many of them came from source address ip.
func (c *Counter) From(ip string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.from[ip]
}

// Port is the port it listens on.
func (c *Counter) Port() int {
	_, p, _ := net.SplitHostPort(c.Addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Reset sets the counts back to zero, after a control has been counted.
func (c *Counter) Reset() {
	c.n.Store(0)
	c.mu.Lock()
	clear(c.from)
	c.mu.Unlock()
}

// ListenTCP listens on addr in namespace ns ("" for the test's own), counts
// each connection and greets it with "ok"; closed when the test ends.
func ListenTCP(t testing.TB, ns, addr string) *Counter {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	c := newCounter(ln.Addr())
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.add(conn.RemoteAddr())
			_, _ = conn.Write([]byte("ok"))
			_ = conn.Close()
		}
	}()
	return c
}

// ListenUDP listens on addr in namespace ns ("" for the test's own) and
// counts datagrams; closed when the test ends.
func ListenUDP(t testing.TB, ns, addr string) *Counter {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(ns, func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err }); err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	c := newCounter(pc.LocalAddr())
	go func() {
		buf := make([]byte, 1500)
		for {
			_, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			c.add(src)
		}
	}()
	return c
}

// StandIn is a host that stands in for one off the machine (a metadata
// service, say): a namespace of the test's that owns Addr, joined to the
// host by a veth, with a TCP listener on Port.
type StandIn struct {
	Dir  string     // where the namespace is mounted
	Addr netip.Addr // the address the namespace owns, routed to it as a /32
	Port int        // its listener's port
	// Bridge, when set, takes the host end of the veth, and the host routes
	// Addr onto the bridge: for senders already on that bridge whose
	// traffic may not leave it. Empty routes Addr to the veth itself.
	Bridge string
	// Gateway, with Bridge, is the namespace's default route (an address
	// of the host's on the bridge), so replies come back through the host
	// the way the requests went.
	Gateway netip.Addr
}

// Start builds the stand-in, removed when the test ends, and returns its
// listener. It fails the test unless the host's route to Addr leads into
// the namespace.
func (s StandIn) Start(t testing.TB) *Counter {
	t.Helper()
	b := make([]byte, 2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	suffix := hex.EncodeToString(b)
	ns, err := netns.Create(s.Dir, "altest-meta-"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(ns) })
	hostName, peerName := "altm"+suffix, "altmp"+suffix
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: peerName}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostName); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	_ = netns.WriteSysctl("net/ipv6/conf/"+hostName+"/disable_ipv6", "1")
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName(peerName)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = netlink.LinkSetNsFd(peer, fd)
	_ = unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	routed := host
	if s.Bridge != "" {
		if routed, err = netlink.LinkByName(s.Bridge); err != nil {
			t.Fatalf("bridge %s: %v", s.Bridge, err)
		}
		if err := netlink.LinkSetMaster(host, routed); err != nil {
			t.Fatalf("ip link set %s master %s: %v", hostName, s.Bridge, err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	host32 := &net.IPNet{IP: s.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}
	err = netns.Do(ns, func() error {
		p, err := netlink.LinkByName(peerName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(p, &netlink.Addr{IPNet: host32}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(p); err != nil {
			return err
		}
		def := &netlink.Route{LinkIndex: p.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
		if s.Gateway.IsValid() {
			def.Scope, def.Gw, def.Flags = netlink.SCOPE_UNIVERSE, s.Gateway.AsSlice(), int(netlink.FLAG_ONLINK)
		}
		return netlink.RouteAdd(def)
	})
	if err != nil {
		t.Fatalf("configure %s: %v", ns, err)
	}
	route := &netlink.Route{LinkIndex: routed.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: host32}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatalf("ip route add %s/32 dev %s: %v", s.Addr, routed.Attrs().Name, err)
	}
	t.Cleanup(func() { _ = netlink.RouteDel(route) })
	// The stand-in must be routed into our namespace, never off the machine.
	rs, err := netlink.RouteGet(s.Addr.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].LinkIndex != routed.Attrs().Index {
		t.Fatalf("route to %s does not go to %s: %v %v", s.Addr, routed.Attrs().Name, rs, err)
	}
	return ListenTCP(t, ns, netip.AddrPortFrom(s.Addr, uint16(s.Port)).String())
}
