package boot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime/network"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// egressStack is the sandbox network and its proxy.
type egressStack struct {
	policy   egress.Policy
	net      *network.Manager
	proxy    *egress.Server
	caBundle []byte
	port     int // the port this instance's proxy listens on
	// secrets and tripwires are what calls may be given (Stack.Secrets).
	secrets   *egress.Secrets
	tripwires bool
}

// upNetwork prepares networked runs: policy, firewall (before any sandbox
// gets an address) and the proxy on the gateway. Instances sharing the
// bridge each run a proxy on a port of their own; when every port of the
// range is taken, it returns ErrProxyTaken.
func (s *Stack) upNetwork(ctx context.Context, cfg config.Config) (*egressStack, error) {
	nc := cfg.Network
	st, err := egress.FromSettings(egress.Settings{Domains: nc.AllowDomains, Ports: nc.AllowPorts, CIDRs: nc.AllowCIDRs,
		Hosts: nc.HostMap(), AllowPrivate: nc.AllowPrivate, CAFile: nc.CAFile, Allow: nc.Allow, Secrets: cfg.Secrets,
		Tripwires: nc.Tripwires, StateDir: cfg.StateDir, Logger: s.log.With("component", "egress")})
	if err != nil {
		return nil, err
	}
	pol, proxy, ca := st.Policy, st.Proxy, st.CABundle

	// Up made the manager and swept dead instances' networks; the firewall
	// goes in before any sandbox gets an address.
	nm := s.net
	if err := nm.EnsureFirewall(); err != nil {
		return nil, fmt.Errorf("firewall: %w", err)
	}

	// Each instance sharing the bridge has its own proxy, on the first free
	// port of the range the firewall opens.
	var ln net.Listener
	nc2 := nm.Config()
	for port := nc2.ProxyPort; port < nc2.ProxyPort+nc2.ProxyPorts; port++ {
		ln, err = listenFreebind(ctx, netip.AddrPortFrom(nc2.Gateway(), uint16(port)).String())
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, ErrProxyTaken
		}
		return nil, fmt.Errorf("egress proxy listen: %w", err)
	}
	go func() { _ = proxy.Serve(ln) }()
	s.closers = append(s.closers, func(context.Context) { _ = proxy.Close() })
	s.log.Info("egress proxy listening", "addr", ln.Addr().String(), "domains", pol.Domains())
	metrics.Escapes.SetFirewall(func() uint64 { return firewallEscapes(nm) })
	return &egressStack{policy: pol, net: nm, proxy: proxy, caBundle: ca, port: ln.Addr().(*net.TCPAddr).Port, secrets: st.Secrets, tripwires: st.Tripwires}, nil
}

// escapeCounters are the firewall's drop rules that only a sandbox trying
// to get past its proxy hits. IPv6 and non-IPv4 frames are left out: a
// network stack's own autoconfiguration sends those unasked.
var escapeCounters = []string{
	network.CounterInputHost, network.CounterInputSpoofed,
	network.CounterForwardFrom, network.CounterForwardTo, network.CounterForwardSrc, network.CounterForwardDst,
	network.CounterBridgeFwd, network.CounterBridgeToPort, network.CounterSpoofedIP, network.CounterSpoofedARP,
}

// firewallEscapes is the packets the firewall dropped as escape attempts,
// by every instance's sandboxes (the tables are shared); 0 when unreadable.
func firewallEscapes(nm *network.Manager) uint64 {
	counts, err := nm.DropCounters()
	if err != nil {
		return 0
	}
	var n uint64
	for _, name := range escapeCounters {
		n += counts[name]
	}
	return n
}

// NetworkConfig is the sandbox network of cfg for the instance instanceID.
func NetworkConfig(cfg config.Config, instanceID string) (network.Config, error) {
	subnet, err := netip.ParsePrefix(cfg.Network.Subnet)
	if err != nil {
		return network.Config{}, fmt.Errorf("network.subnet: %w", err)
	}
	return network.Config{
		Bridge: cfg.Network.Bridge, Subnet: subnet, Table: cfg.Network.Table, ProxyPort: cfg.Network.ProxyPort,
		StateDir: cfg.StateDir, InstanceID: instanceID,
	}, nil
}

// ErrProxyTaken means every proxy port is held by other airlock instances.
var ErrProxyTaken = errors.New("every egress proxy port is taken by other airlock instances")

// listenFreebind listens on addr even before the bridge carrying that
// address exists: the gateway address appears when the first sandbox
// network is set up. It never listens on a wildcard address.
func listenFreebind(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(ctx, "tcp4", addr)
}
