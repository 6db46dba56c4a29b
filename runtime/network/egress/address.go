package egress

import (
	"net/netip"
	"slices"
)

// metadataAddrs are cloud instance-metadata endpoints. They hand out
// credentials to whoever asks from the host, so they are refused even when
// an operator exempts their surrounding range with Options.AllowedPrivate.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, Oracle
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// blockedPrefixes are the ranges a sandbox must never reach through the
// proxy: everything that is not ordinary public unicast. Special-purpose
// ranges that merely cannot be routed (documentation, benchmarking) are
// blocked too, since no legitimate destination lives there and some of them
// embed other addresses (NAT64, 6to4, Teredo) that could lead back inside.
var blockedPrefixes = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		// IPv4
		"0.0.0.0/8",       // "this network", includes 0.0.0.0
		"10.0.0.0/8",      // RFC 1918
		"100.64.0.0/10",   // CGNAT (RFC 6598)
		"127.0.0.0/8",     // loopback
		"169.254.0.0/16",  // link-local, cloud metadata
		"172.16.0.0/12",   // RFC 1918
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // TEST-NET-1
		"192.88.99.0/24",  // 6to4 relay anycast
		"192.168.0.0/16",  // RFC 1918
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // TEST-NET-2
		"203.0.113.0/24",  // TEST-NET-3
		"224.0.0.0/4",     // multicast
		"240.0.0.0/4",     // reserved, includes 255.255.255.255 broadcast
		// IPv6
		"::/96",          // unspecified, loopback, IPv4-compatible
		"::ffff:0:0/96",  // IPv4-mapped
		"64:ff9b::/96",   // NAT64 well-known prefix
		"64:ff9b:1::/48", // local-use NAT64
		"100::/64",       // discard-only
		"2001::/23",      // IETF protocol assignments (Teredo, benchmarking, ORCHID)
		"2001:db8::/32",  // documentation
		"2002::/16",      // 6to4
		"3fff::/20",      // documentation (RFC 9637)
		"fc00::/7",       // unique local
		"fe80::/10",      // link-local
		"fec0::/10",      // site-local (deprecated)
		"ff00::/8",       // multicast
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// addrBlocked reports whether the proxy must refuse to connect to a, given
// the operator's exemptions. The order matters: addresses that are never
// acceptable (invalid, scoped, IPv4-mapped, metadata) are checked before the
// exemptions, so no AllowedPrivate entry can open them.
//
// IPv4-mapped addresses are refused outright rather than unmapped: a host
// map entry or an IP literal written that way is either a mistake or an
// attempt to slip past a check written for IPv4.
func addrBlocked(a netip.Addr, allowedPrivate []netip.Prefix) bool {
	if !a.IsValid() || a.Zone() != "" || a.Is4In6() || slices.Contains(metadataAddrs, a) {
		return true
	}
	if slices.ContainsFunc(allowedPrivate, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return false
	}
	// The standard predicates overlap the table; they are kept as a second
	// opinion in case the table ever loses a line.
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return true
	}
	return slices.ContainsFunc(blockedPrefixes, func(p netip.Prefix) bool { return p.Contains(a) })
}
