package egress

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/airlock-mcp/airlock/metrics"
)

// refusal is a request the proxy answers itself.
type refusal struct {
	code   int
	reason string // a Reason constant
	msg    string // the response body
}

// inspect applies the run's rules, secrets and tripwires to one request
// bound for t, which the proxy can read (plain HTTP, or intercepted
// HTTPS). It rewrites req in place: placeholders become the secret where
// the secret may go, the configured headers are set, and the body is
// wrapped in a scanner. It returns a refusal, or the needles the response
// must be redacted with (the values of the secrets this request carries,
// as sent and URL-escaped).
func (s *Server) inspect(ss *session, t target, req *http.Request, overTLS bool) (*refusal, []needle) {
	p := ss.reg.policy
	// What a refusal names, taken before any substitution: a report made
	// later (a body needle) must not quote the secret put into the path.
	where := Denial{Host: t.host, Port: t.port, Method: req.Method, Path: req.URL.Path}
	deny := func(code int, reason, msg string) (*refusal, []needle) {
		s.report(ss, where, reason)
		return &refusal{code: code, reason: reason, msg: msg}, nil
	}
	c := p.creds
	if c != nil && len(c.trips) > 0 {
		if dest := tripped(c.trips, t, req); dest != "" {
			return deny(http.StatusForbidden, ReasonTripwire, "egress: exfiltration tripwire: a fake credential planted in this sandbox was sent to "+dest+"; the run is being killed")
		}
	}
	if p.restrictsPaths(t.host) && ambiguousPath(req.URL.EscapedPath()) {
		return deny(http.StatusForbidden, ReasonRule, fmt.Sprintf("egress denied: %s's rules match paths, and %q has a backslash, a semicolon or an escaped /, \\, . or ; that servers read differently: send the plain path", t.host, req.URL.EscapedPath()))
	}
	if msg := p.checkRequest(t.host, t.port, req.Method, req.URL.Path); msg != "" {
		return deny(http.StatusForbidden, ReasonRule, "egress denied: "+msg)
	}
	if up := req.Header.Get("Upgrade"); up != "" || httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade") {
		// A WebSocket opening is a GET the rules saw; any other upgrade
		// (h2c, a proxy protocol) would carry requests no rule sees.
		if !strings.EqualFold(up, "websocket") || req.Method != http.MethodGet {
			return deny(http.StatusForbidden, ReasonUpgrade, fmt.Sprintf("egress denied: only WebSocket upgrades (GET, Upgrade: websocket) are carried; this request asked for %q", up))
		}
	}
	if p.restrictsMethods(t.host) {
		// The rule judged the method on the request line; these headers
		// ask some servers for another.
		for _, h := range methodOverrides {
			req.Header.Del(h)
		}
	}
	var redact []needle
	var body []needle
	if c != nil {
		for _, b := range c.bound {
			inHead := headContains(req, b.placeholder)
			switch {
			case inHead && !b.s.forHost(t.host):
				return deny(http.StatusForbidden, ReasonSecretWrongHost, fmt.Sprintf("egress denied: the placeholder of secret %s was sent to %s, which is not one of its hosts (%s)", b.s.name, t.host, strings.Join(patternStrings(b.s.hosts), ", ")))
			case inHead && !overTLS:
				return deny(http.StatusForbidden, ReasonSecretPlainHTTP, fmt.Sprintf("egress denied: secret %s is sent only over HTTPS; use https://%s", b.s.name, t.host))
			case !b.s.forHost(t.host):
				// Anywhere in the body is as wrong as in the head.
				body = append(body, needle{find: []byte(b.placeholder), stop: true, hit: s.midStream(ss, where, ReasonSecretWrongHost)})
				continue
			case !overTLS:
				body = append(body, needle{find: []byte(b.placeholder), stop: true, hit: s.midStream(ss, where, ReasonSecretPlainHTTP)})
				continue
			}
			replaceHead(req, b.placeholder, b.s.value)
			if b.s.header != "" {
				req.Header.Set(b.s.header, b.s.headerValue())
			}
			if b.s.inBody {
				body = append(body, needle{find: []byte(b.placeholder), repl: []byte(b.s.value)})
			}
			// The upstream may echo the value, as sent or escaped; it must
			// reach the sandbox as the placeholder. So: no compressed
			// answers (not searchable), no WebSocket compression, and no
			// ranges (an echo read back in pieces would never hold the
			// whole value).
			redact = append(redact, redactions(b.s.value, b.placeholder)...)
			for _, h := range []string{"Accept-Encoding", "Sec-Websocket-Extensions", "Range", "If-Range"} {
				req.Header.Del(h)
			}
		}
		for _, v := range c.trips {
			body = append(body, needle{find: []byte(v), fold: true, stop: true, hit: s.midStream(ss, where, ReasonTripwire)})
		}
	}
	req.Body = newScanner(req.Body, body)
	if len(body) > 0 {
		// The scanned body's length is not known in advance.
		req.ContentLength = -1
		req.Header.Del("Content-Length")
	}
	*req = *req.WithContext(context.WithValue(req.Context(), whereKey{}, where))
	return nil, redact
}

// ambiguousPath reports whether an escaped request path holds what one
// server reads as a separator or a dot segment and another does not
// ("..;/" on Tomcat, "..\\" on IIS, "%2f"), so that the prefix checked
// here might not be the path served.
func ambiguousPath(escaped string) bool {
	if strings.ContainsAny(escaped, "\\;") {
		return true
	}
	low := strings.ToLower(escaped)
	for _, e := range []string{"%2f", "%5c", "%2e", "%3b", "%00"} {
		if strings.Contains(low, e) {
			return true
		}
	}
	return false
}

// ReasonUpgrade: a protocol upgrade other than a WebSocket opening.
const ReasonUpgrade = "upgrade not carried"

// whereKey carries a request's pre-substitution Denial to the transport.
type whereKey struct{}

// methodOverrides are headers some frameworks take as the real method.
var methodOverrides = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// redactions are the needles that turn value back into placeholder in a
// response: the value as sent, and as a URL quotes it (upper- and
// lower-case hex), since an echo of the request URL carries it escaped.
func redactions(value, placeholder string) []needle {
	forms := []string{value}
	for _, e := range []string{url.QueryEscape(value), url.PathEscape(value)} {
		forms = append(forms, e, lowerHex(e))
	}
	var out []needle
	seen := map[string]bool{}
	for _, f := range forms {
		if !seen[f] {
			seen[f] = true
			out = append(out, needle{find: []byte(f), repl: []byte(placeholder)})
		}
	}
	return out
}

// lowerHex lower-cases the hex digits of %XX escapes.
func lowerHex(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			copy(b[i+1:i+3], asciiLower(b[i+1:i+3]))
			i += 2
		}
	}
	return string(b)
}

// report records a refused request and counts it.
func (s *Server) report(ss *session, where Denial, reason string) {
	where.Reason = reason
	s.reportDenial(ss, where)
}

// reportDenial records d for the run, counts it as an escape attempt
// when it is one, and hands a tripwire to the backend to kill the run.
func (s *Server) reportDenial(ss *session, d Denial) {
	s.recordDenial(ss.reg, d)
	ss.reported.Store(true)
	if kind := escapeKind(d.Reason); kind != "" {
		metrics.Escapes.Inc(kind)
	}
	s.log.Warn("egress request refused", "run", ss.runID(), "host", d.Host, "port", d.Port, "method", d.Method, "path", d.Path, "reason", d.Reason)
	s.mu.Lock()
	trip := s.onTrip
	s.mu.Unlock()
	if d.Reason == ReasonTripwire && trip != nil {
		trip(ss.runID(), d)
	}
}

// midStream is a body needle's hit: report, then end the connection (the
// scanner has already stopped the body short of the needle).
func (s *Server) midStream(ss *session, where Denial, reason string) func() {
	return func() {
		s.report(ss, where, reason)
		ss.abort()
	}
}

// tripped returns where a tripwire value appears in req's destination or
// head ("host:port" named for the result), or "".
func tripped(trips []string, t target, req *http.Request) string {
	dest := fmt.Sprintf("%s:%d", t.host, t.port)
	hay := []string{t.host, req.Host, req.Method, req.Proto, req.URL.String(), req.RequestURI,
		lenientUnescape(req.URL.RawQuery), lenientUnescape(req.URL.EscapedPath()), lenientUnescape(req.RequestURI)}
	for k, vs := range req.Header {
		hay = append(hay, k)
		for _, v := range vs {
			hay = append(hay, v, lenientUnescape(v))
		}
	}
	for _, v := range trips {
		for _, h := range hay {
			if containsFold(h, v) {
				return dest
			}
		}
	}
	return ""
}

// lenientUnescape decodes every valid %XX escape and '+', leaving a bad
// escape as it is: one malformed escape must not hide the rest (the URL
// parsers upstream are lenient too).
func lenientUnescape(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '+':
			b = append(b, ' ')
		case s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, s[i])
		}
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// trippedHost reports whether a tripwire value is in the destination
// name itself. It is checked before the name is resolved: the lookup
// alone would carry the value to whoever serves that domain's DNS.
func trippedHost(p Policy, host string) bool {
	if p.creds == nil {
		return false
	}
	for _, v := range p.creds.trips {
		if containsFold(host, v) {
			return true
		}
	}
	return false
}

// headContains reports whether s is anywhere in req's target or headers.
func headContains(req *http.Request, s string) bool {
	if strings.Contains(req.URL.String(), s) || strings.Contains(req.RequestURI, s) || strings.Contains(req.Host, s) {
		return true
	}
	for k, vs := range req.Header {
		if strings.Contains(k, s) {
			return true
		}
		for _, v := range vs {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// replaceHead substitutes old with new in req's path, query and header
// values.
func replaceHead(req *http.Request, old, new string) {
	u := req.URL
	u.Path = strings.ReplaceAll(u.Path, old, new)
	if u.RawPath != "" {
		u.RawPath = strings.ReplaceAll(u.RawPath, old, url.PathEscape(new))
	}
	u.RawQuery = strings.ReplaceAll(u.RawQuery, old, url.QueryEscape(new))
	for k, vs := range req.Header {
		for i, v := range vs {
			req.Header[k][i] = strings.ReplaceAll(v, old, new)
		}
	}
}

func patternStrings(ps []pattern) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// redactHeader replaces each needle's value in h's values.
func redactHeader(h http.Header, redact []needle) {
	for k, vs := range h {
		for i, v := range vs {
			h[k][i] = redactString(v, redact)
		}
	}
}

// redactString replaces each needle's value in s.
func redactString(s string, redact []needle) string {
	for _, n := range redact {
		s = strings.ReplaceAll(s, string(n.find), string(n.repl))
	}
	return s
}
