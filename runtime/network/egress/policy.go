package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultPorts are the destination ports a Policy allows when the operator
// names none: plain HTTP and HTTPS, which is what package managers use.
var DefaultPorts = []int{80, 443}

// ErrNotCovered is wrapped by the error Narrow returns when a call asks for
// a domain the operator's list does not cover. Callers use errors.Is to tell
// "the arguments are wrong" (report to the caller) from other failures.
var ErrNotCovered = errors.New("not covered by the operator's allow-list")

// ErrInvalidPolicy is wrapped by every error about a malformed domain
// pattern, port or CIDR, so that configuration and tool layers can classify
// the failure without matching strings.
var ErrInvalidPolicy = errors.New("invalid egress policy")

// Policy says where one run may connect: an allow-list of domain patterns,
// the destination ports, and the CIDRs whose addresses may be named
// directly as IP literals.
//
// The zero Policy allows nothing, so a forgotten policy fails closed.
// A Policy is immutable once built; share it freely between goroutines.
type Policy struct {
	domains []pattern      // sorted, deduplicated
	ports   []int          // sorted, deduplicated
	cidrs   []netip.Prefix // deduplicated, in the order given
	rules   []rule         // network.allow entries; they restrict the hosts they match
	creds   *Credentials   // one run's secrets and tripwires; nil: none
}

// pattern is one parsed allow-list entry. For an exact pattern, name is the
// whole host; for a wildcard ("*.example.com"), name is the base
// ("example.com") and any strict subdomain of it matches.
type pattern struct {
	wildcard bool
	name     string
}

func (p pattern) String() string {
	if p.wildcard {
		return "*." + p.name
	}
	return p.name
}

// matches reports whether the normalized host is covered by p. A wildcard
// never matches its apex: "*.githubusercontent.com" is about the CDN's
// subdomains, and an operator who also wants the apex says so explicitly.
func (p pattern) matches(host string) bool {
	if !p.wildcard {
		return host == p.name
	}
	return len(host) > len(p.name)+1 && strings.HasSuffix(host, p.name) && host[len(host)-len(p.name)-1] == '.'
}

// covers reports whether every host q matches is also matched by p, which is
// the test Narrow needs: an exact pattern covers only itself, a wildcard
// covers exact names and narrower wildcards below it.
func (p pattern) covers(q pattern) bool {
	switch {
	case !q.wildcard:
		return p.matches(q.name)
	case !p.wildcard:
		return false
	default:
		return q.name == p.name || p.matches(q.name)
	}
}

// ParsePolicy builds a Policy from the operator's configuration.
//
// domains are patterns: "pypi.org" matches exactly that name;
// "*.githubusercontent.com" matches any subdomain at any depth but not the
// apex. Matching is case-insensitive and a trailing dot is ignored. Names
// must be ASCII (use the xn-- form for internationalized names), and
// patterns that look like URLs, carry a port, or are IP addresses are
// rejected with an error that says what to write instead.
//
// ports default to DefaultPorts when empty. cidrs are prefixes such as
// "10.20.0.0/16" or a single address such as "192.0.2.7"; an IP-literal
// destination is refused unless it lies inside one of them. A prefix with
// host bits set ("10.1.2.3/8") is rejected rather than silently masked,
// because it usually means the operator meant a narrower range.
func ParsePolicy(domains []string, ports []int, cidrs []string) (Policy, error) {
	var p Policy
	for _, d := range domains {
		pat, err := parsePattern(d)
		if err != nil {
			return Policy{}, err
		}
		p.domains = append(p.domains, pat)
	}
	p.domains = sortPatterns(p.domains)

	if len(ports) == 0 {
		ports = DefaultPorts
	}
	for _, port := range ports {
		if port < 1 || port > 65535 {
			return Policy{}, fmt.Errorf("%w: port %d: must be between 1 and 65535", ErrInvalidPolicy, port)
		}
		p.ports = append(p.ports, port)
	}
	slices.Sort(p.ports)
	p.ports = slices.Compact(p.ports)

	for _, c := range cidrs {
		pfx, err := parseCIDR(c)
		if err != nil {
			return Policy{}, err
		}
		if !slices.Contains(p.cidrs, pfx) {
			p.cidrs = append(p.cidrs, pfx)
		}
	}
	return p, nil
}

// Narrow returns a copy of p that allows only the given domains, keeping p's
// ports and CIDRs. It lets one call ask for less than the operator allows,
// never more: every requested pattern must be covered by p (an exact name by
// a matching entry, a wildcard by an equal or broader wildcard), otherwise
// the error names each uncovered pattern and wraps ErrNotCovered.
//
// An empty list yields a policy that allows no domain at all; a caller that
// wants the operator's list unchanged uses p itself.
func (p Policy) Narrow(domains []string) (Policy, error) {
	out := Policy{ports: p.ports, cidrs: p.cidrs, rules: p.rules, creds: p.creds}
	var uncovered []string
	for _, d := range domains {
		q, err := parsePattern(d)
		if err != nil {
			return Policy{}, fmt.Errorf("narrow: %w", err)
		}
		if !slices.ContainsFunc(p.domains, func(op pattern) bool { return op.covers(q) }) {
			uncovered = append(uncovered, strconv.Quote(q.String()))
			continue
		}
		out.domains = append(out.domains, q)
	}
	if len(uncovered) > 0 {
		return Policy{}, fmt.Errorf("narrow: %s: %w", strings.Join(uncovered, ", "), ErrNotCovered)
	}
	out.domains = sortPatterns(out.domains)
	return out, nil
}

// Covers reports whether p's list covers the domain pattern d, as Narrow
// would; an error means d is not a valid pattern.
func (p Policy) Covers(d string) (bool, error) {
	q, err := parsePattern(d)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(p.domains, func(op pattern) bool { return op.covers(q) }), nil
}

// Widen returns a copy of p that also allows the given domain patterns. It
// exists for one purpose: a human granting a domain to one call. Policies
// from configuration are built with ParsePolicy and only ever narrowed.
func (p Policy) Widen(domains []string) (Policy, error) {
	out := Policy{ports: p.ports, cidrs: p.cidrs, rules: p.rules, creds: p.creds, domains: slices.Clone(p.domains)}
	for _, d := range domains {
		q, err := parsePattern(d)
		if err != nil {
			return Policy{}, fmt.Errorf("widen: %w", err)
		}
		out.domains = append(out.domains, q)
	}
	out.domains = sortPatterns(out.domains)
	return out, nil
}

// Domains returns the policy's patterns in canonical form (lower case, no
// trailing dot), sorted, for audit records and error messages.
func (p Policy) Domains() []string {
	out := make([]string, len(p.domains))
	for i, d := range p.domains {
		out[i] = d.String()
	}
	return out
}

// Ports returns the allowed destination ports, sorted.
func (p Policy) Ports() []int { return slices.Clone(p.ports) }

// CIDRs returns the prefixes inside which IP-literal destinations are
// allowed.
func (p Policy) CIDRs() []netip.Prefix { return slices.Clone(p.cidrs) }

// String renders the policy for logs.
func (p Policy) String() string {
	return fmt.Sprintf("domains=%v ports=%v cidrs=%v", p.Domains(), p.ports, p.cidrs)
}

// allowsName reports whether a normalized host name matches the list.
func (p Policy) allowsName(host string) bool {
	return slices.ContainsFunc(p.domains, func(d pattern) bool { return d.matches(host) })
}

func (p Policy) allowsPort(port int) bool {
	_, ok := slices.BinarySearch(p.ports, port)
	return ok
}

func (p Policy) allowsLiteral(a netip.Addr) bool {
	return slices.ContainsFunc(p.cidrs, func(c netip.Prefix) bool { return c.Contains(a) })
}

func sortPatterns(ps []pattern) []pattern {
	slices.SortFunc(ps, func(a, b pattern) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(ps)
}

// parsePattern validates one allow-list entry. The errors are written for
// the operator reading a config error, so each says what to write instead.
func parsePattern(s string) (pattern, error) {
	bad := func(why string) (pattern, error) {
		return pattern{}, fmt.Errorf("%w: domain pattern %q: %s", ErrInvalidPolicy, s, why)
	}
	switch {
	case s == "":
		return bad("empty")
	case strings.Contains(s, "://"):
		return bad(`write a bare domain name, not a URL (e.g. "pypi.org")`)
	case strings.ContainsAny(s, "/?#@"):
		return bad("write a bare domain name without path, query or user")
	case strings.ContainsAny(s, " \t\r\n"):
		return bad("contains whitespace")
	}
	if _, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return bad("IP addresses belong in the CIDR list, not the domain list")
	}
	if strings.Contains(s, ":") {
		return bad("ports are configured separately; remove the :port")
	}
	name := strings.ToLower(s)
	wildcard := false
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		wildcard, name = true, rest
	}
	if strings.Contains(name, "*") {
		return bad(`a wildcard must be the whole leftmost label, as in "*.example.com"`)
	}
	name, err := normalizeName(name)
	if err != nil {
		return bad(err.Error())
	}
	// "*.com" or "*.test" would open a whole top-level domain; that is never
	// what an allow-list means, so demand at least two labels under a "*".
	if wildcard && !strings.Contains(name, ".") {
		return bad("a wildcard must cover a domain with at least two labels, not a whole top-level domain")
	}
	return pattern{wildcard: wildcard, name: name}, nil
}

// normalizeName lower-cases a DNS host name, drops one trailing dot and
// checks the LDH syntax (letters, digits, hyphens; labels of 1 to 63
// characters; at most 253 characters). A last label made only of digits is
// refused, so that "1.2.3.4"-like strings are never treated as names.
func normalizeName(s string) (string, error) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" {
		return "", errors.New("empty name")
	}
	if len(s) > 253 {
		return "", errors.New("longer than 253 characters")
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" {
			return "", errors.New("empty label (two dots in a row, or a leading dot)")
		}
		if len(l) > 63 {
			return "", fmt.Errorf("label %q is longer than 63 characters", l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("label %q starts or ends with a hyphen", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			case c >= 0x80:
				return "", errors.New("not ASCII; write internationalized names in their xn-- (punycode) form")
			default:
				return "", fmt.Errorf("character %q is not allowed in a host name", c)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "", errors.New("the last label is numeric, which makes it look like an IP address")
	}
	return s, nil
}

// parseCIDR accepts a prefix or a bare address (meaning that one host).
func parseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%w: CIDR %q: not a prefix (like 10.0.0.0/8) or an address", ErrInvalidPolicy, s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%w: CIDR %q: zones are not allowed", ErrInvalidPolicy, s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	pfx, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%w: CIDR %q: %v", ErrInvalidPolicy, s, err)
	}
	if m := pfx.Masked(); m != pfx {
		return netip.Prefix{}, fmt.Errorf("%w: CIDR %q has host bits set; did you mean %s or %s/%d?",
			ErrInvalidPolicy, s, m, pfx.Addr(), pfx.Addr().BitLen())
	}
	return pfx, nil
}
