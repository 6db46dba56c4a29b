package egress

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func mustPolicy(t *testing.T, domains []string, ports []int, cidrs []string) Policy {
	t.Helper()
	p, err := ParsePolicy(domains, ports, cidrs)
	if err != nil {
		t.Fatalf("ParsePolicy(%q, %v, %q): %v", domains, ports, cidrs, err)
	}
	return p
}

func TestPatternMatching(t *testing.T) {
	p := mustPolicy(t, []string{"pypi.org", "*.githubusercontent.com", "Files.PythonHosted.org.", "localmirror"}, nil, nil)
	tests := []struct {
		host string
		want bool
	}{
		{"pypi.org", true},
		{"PyPI.org", true},
		{"pypi.org.", true},
		{"www.pypi.org", false}, // exact means exact
		{"pypi.org.evil.com", false},
		{"evilpypi.org", false},
		{"pypi.or", false},
		{"raw.githubusercontent.com", true},
		{"a.b.c.githubusercontent.com", true}, // any depth
		{"RAW.GitHubUserContent.com.", true},
		{"githubusercontent.com", false}, // never the apex
		{"xgithubusercontent.com", false},
		{"githubusercontent.com.evil.com", false},
		{".githubusercontent.com", false},
		{"files.pythonhosted.org", true},
		{"localmirror", true},
		{"", false},
		{"..", false},
		{"pypi..org", false},
		{"1.2.3.4", false},
	}
	for _, tt := range tests {
		name, err := normalizeName(tt.host)
		got := err == nil && p.allowsName(name)
		if got != tt.want {
			t.Errorf("allows %q = %v, want %v", tt.host, got, tt.want)
		}
	}
}

func TestParsePolicyCanonical(t *testing.T) {
	p := mustPolicy(t, []string{"B.example.com", "a.example.com.", "b.example.com", "*.Z.example.com"}, nil, []string{"192.0.2.7", "10.0.0.0/8", "10.0.0.0/8", "2001:db8::/32"})
	if got, want := p.Domains(), []string{"*.z.example.com", "a.example.com", "b.example.com"}; !slices.Equal(got, want) {
		t.Errorf("Domains = %q, want %q", got, want)
	}
	if got := p.Ports(); !slices.Equal(got, []int{80, 443}) {
		t.Errorf("default Ports = %v, want [80 443]", got)
	}
	wantCIDRs := []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	if got := p.CIDRs(); !slices.Equal(got, wantCIDRs) {
		t.Errorf("CIDRs = %v, want %v", got, wantCIDRs)
	}
	q := mustPolicy(t, nil, []int{8443, 22, 8443}, nil)
	if got := q.Ports(); !slices.Equal(got, []int{22, 8443}) {
		t.Errorf("Ports = %v, want [22 8443]", got)
	}
	if !q.allowsPort(22) || q.allowsPort(443) {
		t.Errorf("explicit ports must replace the defaults: %v", q.Ports())
	}
	var zero Policy
	if zero.allowsName("pypi.org") || zero.allowsPort(443) || zero.allowsLiteral(netip.MustParseAddr("1.1.1.1")) {
		t.Error("the zero Policy must allow nothing")
	}
}

func TestParsePolicyErrors(t *testing.T) {
	tests := []struct {
		name    string
		domains []string
		ports   []int
		cidrs   []string
		want    string // substring of the error
	}{
		{"empty pattern", []string{""}, nil, nil, "empty"},
		{"url", []string{"https://pypi.org"}, nil, nil, "not a URL"},
		{"path", []string{"pypi.org/simple"}, nil, nil, "without path"},
		{"port", []string{"pypi.org:443"}, nil, nil, "remove the :port"},
		{"ipv4 as domain", []string{"10.0.0.1"}, nil, nil, "CIDR list"},
		{"ipv6 as domain", []string{"[::1]"}, nil, nil, "CIDR list"},
		{"bare star", []string{"*"}, nil, nil, "wildcard"},
		{"star dot", []string{"*."}, nil, nil, "empty"},
		{"star tld", []string{"*.com"}, nil, nil, "top-level domain"},
		{"star in middle", []string{"a.*.example.com"}, nil, nil, "leftmost label"},
		{"partial star", []string{"a*.example.com"}, nil, nil, "leftmost label"},
		{"double star", []string{"*.*.example.com"}, nil, nil, "leftmost label"},
		{"double dot", []string{"pypi..org"}, nil, nil, "empty label"},
		{"leading dot", []string{".pypi.org"}, nil, nil, "empty label"},
		{"hyphen", []string{"-pypi.org"}, nil, nil, "hyphen"},
		{"underscore", []string{"py_pi.org"}, nil, nil, "not allowed"},
		{"unicode", []string{"bücher.de"}, nil, nil, "xn--"},
		{"space", []string{"pypi.org "}, nil, nil, "whitespace"},
		{"numeric tld", []string{"foo.123"}, nil, nil, "numeric"},
		{"long label", []string{strings.Repeat("a", 64) + ".org"}, nil, nil, "63"},
		{"long name", []string{strings.Repeat("abcdefghi.", 26) + "org"}, nil, nil, "253"},
		{"port zero", nil, []int{0}, nil, "port 0"},
		{"port too big", nil, []int{65536}, nil, "port 65536"},
		{"bad cidr", nil, nil, []string{"10.0.0.0/33"}, "CIDR"},
		{"cidr garbage", nil, nil, []string{"example.com"}, "CIDR"},
		{"host bits", nil, nil, []string{"10.1.2.3/8"}, "host bits"},
		{"zone", nil, nil, []string{"fe80::1%eth0"}, "zone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePolicy(tt.domains, tt.ports, tt.cidrs)
			if err == nil {
				t.Fatalf("ParsePolicy accepted %q %v %q", tt.domains, tt.ports, tt.cidrs)
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Errorf("error %v does not wrap ErrInvalidPolicy", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func TestNarrow(t *testing.T) {
	op := mustPolicy(t, []string{"pypi.org", "*.githubusercontent.com", "*.pythonhosted.org"}, []int{443}, []string{"192.0.2.0/24"})
	tests := []struct {
		name    string
		ask     []string
		want    []string // resulting domains; nil with wantErr
		wantErr []string // domains the error must name
	}{
		{"same exact", []string{"pypi.org"}, []string{"pypi.org"}, nil},
		{"subset", []string{"PyPI.org.", "raw.githubusercontent.com"}, []string{"pypi.org", "raw.githubusercontent.com"}, nil},
		{"same wildcard", []string{"*.githubusercontent.com"}, []string{"*.githubusercontent.com"}, nil},
		{"narrower wildcard", []string{"*.objects.githubusercontent.com"}, []string{"*.objects.githubusercontent.com"}, nil},
		{"nothing", nil, []string{}, nil},
		{"widen new name", []string{"pypi.org", "evil.com"}, nil, []string{`"evil.com"`}},
		{"widen to apex", []string{"githubusercontent.com"}, nil, []string{`"githubusercontent.com"`}},
		{"widen exact to wildcard", []string{"*.pypi.org"}, nil, []string{`"*.pypi.org"`}},
		{"widen wildcard", []string{"*.org"}, nil, []string{"top-level"}},
		{"two uncovered", []string{"a.com", "b.com"}, nil, []string{`"a.com"`, `"b.com"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := op.Narrow(tt.ask)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Narrow(%q) = %v, want an error", tt.ask, got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %s", err, w)
					}
				}
				if !errors.Is(err, ErrNotCovered) && !errors.Is(err, ErrInvalidPolicy) {
					t.Errorf("error %v wraps neither ErrNotCovered nor ErrInvalidPolicy", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Narrow(%q): %v", tt.ask, err)
			}
			if !slices.Equal(got.Domains(), tt.want) {
				t.Errorf("Domains = %q, want %q", got.Domains(), tt.want)
			}
			if !slices.Equal(got.Ports(), op.Ports()) || !slices.Equal(got.CIDRs(), op.CIDRs()) {
				t.Errorf("Narrow changed ports or CIDRs: %v", got)
			}
		})
	}
	// The error for a widening is ErrNotCovered specifically, so the tool
	// layer can answer "the arguments are wrong".
	if _, err := op.Narrow([]string{"evil.com"}); !errors.Is(err, ErrNotCovered) {
		t.Errorf("widening error %v does not wrap ErrNotCovered", err)
	}
	// A narrowed policy really is narrower.
	n, err := op.Narrow([]string{"raw.githubusercontent.com"})
	if err != nil {
		t.Fatal(err)
	}
	if n.allowsName("pypi.org") || !n.allowsName("raw.githubusercontent.com") || n.allowsName("x.githubusercontent.com") {
		t.Errorf("narrowed policy matches wrongly: %v", n)
	}
}

func TestAllowRules(t *testing.T) {
	base, err := ParsePolicy([]string{"*.example.com"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rule AllowRule
		want string // error text; "" for valid
	}{
		{"valid", AllowRule{Domain: "api.example.com", Methods: []string{"get"}, Paths: []string{"/v1/", "/health"}}, ""},
		{"url", AllowRule{Domain: "https://api.example.com"}, "bare domain"},
		{"connect", AllowRule{Domain: "a.test", Methods: []string{"CONNECT"}}, "handles CONNECT itself"},
		{"bad method", AllowRule{Domain: "a.test", Methods: []string{"G ET"}}, "HTTP method"},
		{"relative path", AllowRule{Domain: "a.test", Paths: []string{"v1"}}, "clean absolute prefix"},
		{"dotdot path", AllowRule{Domain: "a.test", Paths: []string{"/v1/../admin"}}, "clean absolute prefix"},
		{"escaped path", AllowRule{Domain: "a.test", Paths: []string{"/v1%2f"}}, "clean absolute prefix"},
		{"bad port", AllowRule{Domain: "a.test", Ports: []int{70000}}, "between 1 and 65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := base.WithRules([]AllowRule{tc.rule})
			if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
	p, err := base.WithRules([]AllowRule{
		{Domain: "api.example.com", Methods: []string{"GET"}, Paths: []string{"/v1/", "/health"}},
		{Domain: "ws.test", Ports: []int{8443}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host         string
		port         int
		method, path string
		ok           bool
	}{
		{"api.example.com", 443, "GET", "/v1/users", true},
		{"api.example.com", 443, "GET", "/v1/", true},
		{"api.example.com", 443, "GET", "/v1", true},
		{"api.example.com", 443, "GET", "/health", true},
		{"api.example.com", 443, "GET", "/healthz", false},
		{"api.example.com", 443, "GET", "/health/x", true},
		{"api.example.com", 443, "POST", "/v1/users", false},
		{"api.example.com", 443, "GET", "/v1//users", false},
		{"api.example.com", 443, "GET", "/v1/./users", false},
		{"api.example.com", 443, "GET", "/v2/users", false},
		{"www.example.com", 443, "DELETE", "/anything", true}, // no rule: the wildcard's any method
	} {
		got := p.checkRequest(tc.host, tc.port, tc.method, tc.path) == ""
		if got != tc.ok {
			t.Errorf("%s %s%s: allowed=%v, want %v (%s)", tc.method, tc.host, tc.path, got, tc.ok, p.checkRequest(tc.host, tc.port, tc.method, tc.path))
		}
	}
	// A rule's own port is allowed for its host only.
	if !p.allowsHostPort("ws.test", 8443) || p.allowsHostPort("ws.test", 443) || p.allowsHostPort("www.example.com", 8443) {
		t.Error("rule ports leak to or from other hosts")
	}
	if !p.allowsName("ws.test") {
		t.Error("a rule's domain is not allowed")
	}
	// Narrowing keeps the rules of what is kept.
	n, err := p.Narrow([]string{"api.example.com"})
	if err != nil || n.checkRequest("api.example.com", 443, "POST", "/v1/") == "" {
		t.Errorf("narrowed: %v, rules lost", err)
	}
	if !p.needsL7("api.example.com") || p.needsL7("ws.test") || p.needsL7("www.example.com") {
		t.Error("needsL7")
	}
}
