package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Resolver looks up the addresses of a host name. *net.Resolver satisfies
// it, so net.DefaultResolver (the default) or a custom net.Resolver can be
// passed as is; tests pass a fake. The proxy always asks for network "ip".
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens an upstream connection. The proxy only ever calls it with
// network "tcp" and an address of the form "IP:port" (never a name), so a
// test hook sees exactly which vetted address would be reached. The default
// is (&net.Dialer{}).DialContext.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// errNoAddresses is reported when a lookup succeeds with an empty answer.
var errNoAddresses = errors.New("no addresses")

// normalizeHosts validates and canonicalizes a static host map, so lookups
// can use the same normalized name as policy matching.
func normalizeHosts(in map[string][]netip.Addr) (map[string][]netip.Addr, error) {
	out := make(map[string][]netip.Addr, len(in))
	for name, addrs := range in {
		n, err := normalizeName(name)
		if err != nil {
			return nil, fmt.Errorf("egress: host map entry %q: %w", name, err)
		}
		for _, a := range addrs {
			if !a.IsValid() {
				return nil, fmt.Errorf("egress: host map entry %q: invalid address", name)
			}
		}
		out[n] = append(out[n], addrs...)
	}
	return out, nil
}

// resolve returns the addresses for a normalized name: the static host map
// first (it is how air-gapped sites and tests pin names), then the
// Resolver. Addresses from the Resolver are unmapped because Go's resolver
// reports A records as IPv4-mapped IPv6 (net.IP's 16-byte form); host map
// entries are taken literally, so a mapped address there is refused later.
func (s *Server) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	if addrs, ok := s.hosts[name]; ok {
		if len(addrs) == 0 {
			return nil, fmt.Errorf("host map entry %q: %w", name, errNoAddresses)
		}
		return addrs, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.ResolveTimeout)
	defer cancel()
	addrs, err := s.opts.Resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("looking up %q: %w", name, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("looking up %q: %w", name, errNoAddresses)
	}
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.Unmap()
	}
	return out, nil
}
