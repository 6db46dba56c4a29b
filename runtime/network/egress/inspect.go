package egress

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

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
// must be redacted with (the values of the secrets this request carries).
func (s *Server) inspect(ss *session, t target, req *http.Request, overTLS bool) (*refusal, []needle) {
	p := ss.reg.policy
	deny := func(code int, reason, msg string) (*refusal, []needle) {
		s.report(ss, t, req, reason)
		return &refusal{code: code, reason: reason, msg: msg}, nil
	}
	c := p.creds
	if c != nil && len(c.trips) > 0 {
		if dest := tripped(c.trips, t, req); dest != "" {
			return deny(http.StatusForbidden, ReasonTripwire, "egress: exfiltration tripwire: a fake credential planted in this sandbox was sent to "+dest+"; the run is being killed")
		}
	}
	if msg := p.checkRequest(t.host, t.port, req.Method, req.URL.Path); msg != "" {
		return deny(http.StatusForbidden, ReasonRule, "egress denied: "+msg)
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
			case !b.s.forHost(t.host) || !overTLS:
				// Anywhere in the body is as wrong as in the head.
				body = append(body, needle{find: []byte(b.placeholder), stop: true, hit: s.midStream(ss, t, req, ReasonSecretWrongHost)})
				continue
			}
			replaceHead(req, b.placeholder, b.s.value)
			if b.s.header != "" {
				req.Header.Set(b.s.header, b.s.headerValue())
			}
			if b.s.inBody {
				body = append(body, needle{find: []byte(b.placeholder), repl: []byte(b.s.value)})
			}
			// The upstream may echo the value; it must reach the sandbox
			// as the placeholder, so compressed answers are not asked for.
			redact = append(redact, needle{find: []byte(b.s.value), repl: []byte(b.placeholder)})
			req.Header.Del("Accept-Encoding")
		}
		for _, v := range c.trips {
			body = append(body, needle{find: []byte(v), fold: true, stop: true, hit: s.midStream(ss, t, req, ReasonTripwire)})
		}
	}
	req.Body = newScanner(req.Body, body)
	if len(body) > 0 {
		// The scanned body's length is not known in advance.
		req.ContentLength = -1
		req.Header.Del("Content-Length")
	}
	return nil, redact
}

// report records a refused request and counts it.
func (s *Server) report(ss *session, t target, req *http.Request, reason string) {
	s.reportDenial(ss, Denial{Host: t.host, Port: t.port, Reason: reason, Method: req.Method, Path: req.URL.Path})
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

// midStream is a body needle's hit: report, then end the connection (the
// scanner has already stopped the body short of the needle).
func (s *Server) midStream(ss *session, t target, req *http.Request, reason string) func() {
	return func() {
		s.report(ss, t, req, reason)
		ss.abort()
	}
}

// tripped returns where a tripwire value appears in req's destination or
// head ("host:port" named for the result), or "".
func tripped(trips []string, t target, req *http.Request) string {
	dest := fmt.Sprintf("%s:%d", t.host, t.port)
	hay := []string{t.host, req.Host, req.URL.String(), req.RequestURI}
	if q, err := url.QueryUnescape(req.URL.RawQuery); err == nil {
		hay = append(hay, q)
	}
	if p, err := url.PathUnescape(req.URL.EscapedPath()); err == nil {
		hay = append(hay, p)
	}
	for k, vs := range req.Header {
		hay = append(hay, k)
		hay = append(hay, vs...)
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
			for _, n := range redact {
				v = strings.ReplaceAll(v, string(n.find), string(n.repl))
			}
			h[k][i] = v
		}
	}
}
