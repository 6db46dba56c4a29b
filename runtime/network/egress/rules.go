package egress

import (
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
)

// ReasonRule: a request outside the method, path or port its host's
// network.allow rules permit.
const ReasonRule = "outside its allow rule"

// AllowRule is one network.allow entry as the operator writes it: a
// domain pattern and, optionally, the ports, methods and path prefixes
// requests to it may use. Empty lists mean "any" (ports: allow_ports).
type AllowRule struct {
	Domain  string   `mapstructure:"domain" json:"domain"`
	Ports   []int    `mapstructure:"ports" json:"ports,omitempty"`
	Methods []string `mapstructure:"methods" json:"methods,omitempty"`
	Paths   []string `mapstructure:"paths" json:"paths,omitempty"`
}

// rule is a parsed AllowRule.
type rule struct {
	pat     pattern
	ports   []int    // sorted; empty: the policy's ports
	methods []string // upper case, sorted; empty: any
	paths   []string // prefixes; empty: any
}

func (r rule) String() string {
	var parts []string
	parts = append(parts, r.pat.String())
	if len(r.ports) > 0 {
		parts = append(parts, fmt.Sprintf("ports %v", r.ports))
	}
	if len(r.methods) > 0 {
		parts = append(parts, "methods "+strings.Join(r.methods, ","))
	}
	if len(r.paths) > 0 {
		parts = append(parts, "paths "+strings.Join(r.paths, ","))
	}
	return strings.Join(parts, " ")
}

// l7 reports whether the rule constrains requests, which for HTTPS
// means the proxy has to read them.
func (r rule) l7() bool { return len(r.methods) > 0 || len(r.paths) > 0 }

// WithRules returns a copy of p that also allows each rule's domain, with
// the rule's constraints. A host that any rule matches is held to those
// rules: a request must fit at least one of them, even when a broader
// allow_domains entry also matches, so "*.github.com" beside
// {domain: api.github.com, methods: [GET]} still makes the API read-only.
func (p Policy) WithRules(rules []AllowRule) (Policy, error) {
	out := p
	out.domains = slices.Clone(p.domains)
	out.rules = slices.Clone(p.rules)
	for i, ar := range rules {
		r, err := parseRule(ar)
		if err != nil {
			return Policy{}, fmt.Errorf("network.allow[%d]: %w", i, err)
		}
		out.rules = append(out.rules, r)
		out.domains = append(out.domains, r.pat)
	}
	out.domains = sortPatterns(out.domains)
	return out, nil
}

func parseRule(ar AllowRule) (rule, error) {
	pat, err := parsePattern(ar.Domain)
	if err != nil {
		return rule{}, err
	}
	r := rule{pat: pat}
	for _, port := range ar.Ports {
		if port < 1 || port > 65535 {
			return rule{}, fmt.Errorf("%w: port %d: must be between 1 and 65535", ErrInvalidPolicy, port)
		}
		r.ports = append(r.ports, port)
	}
	slices.Sort(r.ports)
	r.ports = slices.Compact(r.ports)
	for _, m := range ar.Methods {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
			return rule{}, fmt.Errorf("%w: method %q: write an HTTP method such as GET or POST", ErrInvalidPolicy, m)
		}
		if m == http.MethodConnect {
			return rule{}, fmt.Errorf("%w: method CONNECT: the proxy handles CONNECT itself; list the methods of the requests inside", ErrInvalidPolicy)
		}
		r.methods = append(r.methods, m)
	}
	slices.Sort(r.methods)
	r.methods = slices.Compact(r.methods)
	for _, pfx := range ar.Paths {
		if !strings.HasPrefix(pfx, "/") || strings.ContainsAny(pfx, "?#%") || path.Clean(pfx) != strings.TrimSuffix(pfx, "/") && pfx != "/" {
			return rule{}, fmt.Errorf("%w: path %q: write a clean absolute prefix such as /repos/ (no query, no %%-escapes, no ..)", ErrInvalidPolicy, pfx)
		}
		r.paths = append(r.paths, pfx)
	}
	return r, nil
}

// anyL7 reports whether some rule constrains requests.
func (p Policy) anyL7() bool { return slices.ContainsFunc(p.rules, rule.l7) }

// rulesFor returns the rules whose domain matches host.
func (p Policy) rulesFor(host string) []rule {
	var out []rule
	for _, r := range p.rules {
		if r.pat.matches(host) {
			out = append(out, r)
		}
	}
	return out
}

// allowsHostPort is the connection-level check: the name is on the list,
// and the port is one a matching rule names or, for hosts without rules
// (or rules without ports), one of the policy's ports.
func (p Policy) allowsHostPort(host string, port int) bool {
	rs := p.rulesFor(host)
	if len(rs) == 0 {
		return p.allowsPort(port)
	}
	for _, r := range rs {
		if len(r.ports) == 0 && p.allowsPort(port) || slices.Contains(r.ports, port) {
			return true
		}
	}
	return false
}

// restrictsMethods reports whether a rule for host limits its methods.
func (p Policy) restrictsMethods(host string) bool {
	return slices.ContainsFunc(p.rulesFor(host), func(r rule) bool { return len(r.methods) > 0 })
}

// restrictsPaths reports whether a rule for host limits its paths.
func (p Policy) restrictsPaths(host string) bool {
	return slices.ContainsFunc(p.rulesFor(host), func(r rule) bool { return len(r.paths) > 0 })
}

// needsL7 reports whether requests to host must be read (and so, over
// TLS, intercepted) to enforce a rule.
func (p Policy) needsL7(host string) bool {
	return slices.ContainsFunc(p.rulesFor(host), rule.l7)
}

// checkRequest applies host's rules to one request. It returns "" when the
// request fits a rule (or the host has none), else a sentence naming the
// rules that refused it, for the 403 body.
func (p Policy) checkRequest(host string, port int, method, reqPath string) string {
	rs := p.rulesFor(host)
	if len(rs) == 0 {
		return ""
	}
	clean := path.Clean("/" + reqPath)
	if strings.HasSuffix(reqPath, "/") && clean != "/" {
		clean += "/"
	}
	var names []string
	for _, r := range rs {
		if (len(r.ports) == 0 && p.allowsPort(port) || slices.Contains(r.ports, port)) &&
			(len(r.methods) == 0 || slices.Contains(r.methods, method)) &&
			(len(r.paths) == 0 || slices.ContainsFunc(r.paths, func(pfx string) bool { return pathUnder(clean, pfx) })) &&
			clean == reqPath {
			return ""
		}
		names = append(names, "{"+r.String()+"}")
	}
	if clean != reqPath {
		return fmt.Sprintf("%s %s is not a canonical path (no //, . or .. segments) and rules match canonical paths only", method, reqPath)
	}
	return fmt.Sprintf("%s %s on %s is outside network.allow rule %s", method, reqPath, host, strings.Join(names, " and "))
}

// pathUnder reports whether p is the prefix itself or lies below it: "/v1"
// covers "/v1" and "/v1/x" but not "/v10"; "/v1/" covers what is below.
func pathUnder(p, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(p, prefix) || p+"/" == prefix
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}
