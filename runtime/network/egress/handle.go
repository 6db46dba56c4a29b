package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-mcp/airlock/metrics"
)

// Decisions, as logged.
const (
	decisionAllow  = "allow"  // proxied
	decisionDeny   = "deny"   // refused by policy or registration
	decisionReject = "reject" // malformed or unsupported request
	decisionError  = "error"  // upstream failure
)

// reasonUnregistered: a connection from an address no live run holds.
const reasonUnregistered = "unregistered source"

// session is one client connection from accept to close.
type session struct {
	srv     *Server
	client  *meteredConn
	src     netip.Addr
	reg     *registration // nil when the source is not registered
	counted bool          // holds a MaxConnsPerRun slot
	start   time.Time

	mu       sync.Mutex
	upstream net.Conn
	aborted  bool

	// Filled in as the request is understood; logged by finish.
	method, host     string
	port             int
	decision, reason string
	detail           error
	up, down         atomic.Int64 // bytes sent to / received from upstream
	lastActive       atomic.Int64 // unix nanoseconds, for the idle timer
	idled            atomic.Bool  // closed by the idle timer
	// empty: the client closed without sending a byte (a reachability
	// probe, such as a networked pod's driver's before its first work):
	// no request, so neither counted nor logged above debug.
	empty bool
	// intercepted: TLS terminated by the proxy; requests counts the HTTP
	// requests read inside it.
	intercepted bool
	requests    atomic.Int64
	// reported: refusals were already counted one by one (reportDenial),
	// so finish must not count the connection's reason again.
	reported atomic.Bool
}

// abort closes both ends, unblocking whatever the handler is waiting on.
// It is how Close, unregister and the idle timer stop a session.
func (ss *session) abort() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.aborted = true
	_ = ss.client.Close()
	if ss.upstream != nil {
		_ = ss.upstream.Close()
	}
}

// setUpstream attaches the upstream connection so abort can reach it; it
// fails (closing c) if the session was aborted while dialing.
func (ss *session) setUpstream(c net.Conn) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.aborted {
		_ = c.Close()
		return false
	}
	ss.upstream = c
	return true
}

func (ss *session) touch() { ss.lastActive.Store(time.Now().UnixNano()) }

func (ss *session) runID() string {
	if ss.reg == nil {
		return ""
	}
	return ss.reg.runID
}

// set records how the connection went, for its log line. An intercepted
// connection's HTTP/2 streams call it from their own goroutines.
func (ss *session) set(decision, reason string, detail error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.decision, ss.reason, ss.detail = decision, reason, detail
}

// setDetail records an error beside the decision.
func (ss *session) setDetail(err error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.detail = err
}

func (s *Server) handle(c net.Conn) {
	defer s.wg.Done()
	ss := &session{srv: s, start: time.Now(), decision: decisionReject}
	ss.client = &meteredConn{Conn: c, touch: ss.touch}
	ss.src = remoteAddr(c)
	defer s.finish(ss)

	switch s.admit(ss) {
	case unregistered:
		// Answer at once, without reading the request: an unknown source
		// must not be able to hold proxy resources for HeaderTimeout.
		ss.set(decisionDeny, reasonUnregistered, nil)
		writeResponse(ss.client, http.StatusForbidden, "Forbidden", "egress: this source address is not registered with the proxy")
		lingerClose(c)
		return
	case overLimit:
		ss.set(decisionDeny, "too many connections", nil)
		writeResponse(ss.client, http.StatusTooManyRequests, "Too Many Requests",
			fmt.Sprintf("egress: this run already has %d open connections", s.opts.MaxConnsPerRun))
		lingerClose(c)
		return
	}

	req, br, err := s.readRequest(ss)
	if errors.Is(err, errNoRequest) {
		ss.empty = true
		return
	}
	if err != nil {
		ss.set(decisionReject, "bad request", err)
		var tooBig *headerTooLargeError
		switch {
		case errors.As(err, &tooBig):
			writeResponse(ss.client, http.StatusRequestHeaderFieldsTooLarge, "Request Header Fields Too Large", "egress: "+err.Error())
			lingerClose(c)
		case errors.Is(err, io.EOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
			// Nothing useful to say to a client that left or stalled.
		default:
			writeResponse(ss.client, http.StatusBadRequest, "Bad Request", "egress: malformed request: "+err.Error())
			lingerClose(c)
		}
		return
	}
	ss.method = req.Method
	switch {
	case req.Method == http.MethodConnect:
		s.serveConnect(ss, req, br)
	case req.URL.IsAbs():
		s.serveHTTP(ss, req, br)
	default:
		ss.set(decisionReject, "not a proxy request", nil)
		writeResponse(ss.client, http.StatusBadRequest, "Bad Request",
			"egress: this is an egress proxy: send CONNECT host:port for TLS, or an absolute URI (GET http://host/path) for plain HTTP")
		lingerClose(c)
	}
}

// finish counts and logs the connection once, then releases everything
// it held.
func (s *Server) finish(ss *session) {
	ss.abort()
	s.release(ss)
	if ss.empty {
		s.log.Debug("egress connection closed without a request", "run", ss.runID(), "src", ss.src.String())
		return
	}
	metrics.EgressRequests.WithLabelValues(ss.decision).Inc()
	if kind := escapeKind(ss.reason); kind != "" && !ss.reported.Load() {
		metrics.Escapes.Inc(kind)
	}
	attrs := []any{
		"run", ss.runID(), "src", ss.src.String(), "method", ss.method,
		"host", ss.host, "port", ss.port,
		"bytes_up", ss.up.Load(), "bytes_down", ss.down.Load(),
		"decision", ss.decision, "reason", ss.reason,
		"duration", time.Since(ss.start).Round(time.Millisecond),
	}
	if ss.detail != nil {
		attrs = append(attrs, "err", ss.detail.Error())
	}
	if ss.intercepted {
		attrs = append(attrs, "intercepted", true, "requests", ss.requests.Load())
	}
	if ss.idled.Load() {
		attrs = append(attrs, "idle_timeout", s.opts.IdleTimeout)
	}
	if ss.decision == decisionAllow {
		s.log.Info("egress connection", attrs...)
	} else {
		s.log.Warn("egress connection", attrs...)
	}
}

// escapeKind is the escape-attempt kind a refusal counts as, or "" when
// it is none (a malformed request, a name that does not resolve).
func escapeKind(reason string) string {
	switch reason {
	case ReasonPrivate:
		return metrics.EscapeForbiddenAddress
	case ReasonIPLiteral:
		return metrics.EscapeIPLiteral
	case ReasonNotAllowed, ReasonPort:
		return metrics.EscapeDeniedDestination
	case ReasonSNI:
		return metrics.EscapeSNIMismatch
	case ReasonRule:
		return metrics.EscapeDeniedDestination
	case ReasonSecretWrongHost, ReasonSecretPlainHTTP:
		return metrics.EscapeSecretWrongHost
	case ReasonTripwire:
		return metrics.EscapeTripwire
	case reasonUnregistered:
		return metrics.EscapeUnregisteredSource
	}
	return ""
}

// headerTooLargeError reports a request head over MaxHeaderBytes.
type headerTooLargeError struct{ limit int }

func (e *headerTooLargeError) Error() string {
	return fmt.Sprintf("request header exceeds %d bytes", e.limit)
}

// readRequest reads the request head under HeaderTimeout and
// MaxHeaderBytes. The returned reader continues with whatever the client
// sent after the head (a body, or an eager ClientHello), without limit.
func (s *Server) readRequest(ss *session) (*http.Request, *bufio.Reader, error) {
	lr := &io.LimitedReader{R: ss.client, N: int64(s.opts.MaxHeaderBytes)}
	br := bufio.NewReaderSize(lr, 4096)
	_ = ss.client.SetReadDeadline(time.Now().Add(s.opts.HeaderTimeout))
	req, err := http.ReadRequest(br)
	if err != nil {
		if lr.N <= 0 {
			return nil, nil, &headerTooLargeError{limit: s.opts.MaxHeaderBytes}
		}
		if errors.Is(err, io.EOF) && lr.N == int64(s.opts.MaxHeaderBytes) {
			return nil, nil, errNoRequest
		}
		return nil, nil, fmt.Errorf("reading request: %w", err)
	}
	lr.N = math.MaxInt64
	_ = ss.client.SetReadDeadline(time.Time{})
	return req, br, nil
}

// errNoRequest: the client closed the connection without sending a byte.
var errNoRequest = errors.New("closed before a request")

// target is a destination that passed every check.
type target struct {
	host    string // normalized name or canonical IP
	literal bool   // host is an IP literal
	port    int
	addrs   []netip.Addr // vetted; dial these, never the name
}

// check authorizes host:port for the session; on refusal it has answered
// the client.
func (s *Server) check(ss *session, host string, port int) (target, bool) {
	if trippedHost(ss.reg.policy, host) {
		t := target{host: strings.ToLower(strings.TrimSuffix(host, ".")), port: port}
		ss.host = t.host
		ss.set(decisionDeny, ReasonTripwire, nil)
		s.reportDenial(ss, Denial{Host: t.host, Port: port, Reason: ReasonTripwire, Method: ss.method})
		writeResponse(ss.client, http.StatusForbidden, "Forbidden ("+ReasonTripwire+")",
			"egress: exfiltration tripwire: a fake credential planted in this sandbox is in the host name; the run is being killed")
		lingerClose(ss.client.Conn)
		return t, false
	}
	t, reason, detail := s.authorize(s.ctx, ss.reg.policy, host, port)
	ss.host = t.host
	if reason != "" {
		s.denyResponse(ss, t, reason, detail)
		return t, false
	}
	return t, true
}

// connect dials the vetted t and attaches it to the session; on failure
// it has answered the client.
func (s *Server) connect(ss *session, t target) (up net.Conn, ok bool) {
	up, err := s.dial(ss, t)
	if err != nil {
		s.dialFailed(ss, t, err)
		return nil, false
	}
	if !ss.setUpstream(up) {
		return nil, false
	}
	return up, true
}

// authorize applies the run's policy and the private-address check to
// host:port. On refusal it returns the Denial reason (and a detail for the
// log); the destination is then never dialed.
func (s *Server) authorize(ctx context.Context, p Policy, rawHost string, port int) (target, string, error) {
	t := target{host: strings.ToLower(strings.TrimSuffix(rawHost, ".")), port: port}
	if a, err := netip.ParseAddr(rawHost); err == nil {
		t.host, t.literal = a.String(), true
		switch {
		case a.Zone() != "" || !p.allowsLiteral(a):
			return t, ReasonIPLiteral, nil
		case !p.allowsPort(port):
			return t, ReasonPort, nil
		case addrBlocked(a, s.opts.AllowedPrivate):
			return t, ReasonPrivate, nil
		}
		t.addrs = []netip.Addr{a}
		return t, "", nil
	}
	name, err := normalizeName(rawHost)
	if err != nil {
		return t, ReasonNotAllowed, fmt.Errorf("host %q: %w", rawHost, err)
	}
	t.host = name
	if !p.allowsName(name) {
		return t, ReasonNotAllowed, nil
	}
	if !p.allowsHostPort(name, port) {
		return t, ReasonPort, nil
	}
	addrs, err := s.resolve(ctx, name)
	if err != nil {
		return t, ReasonResolve, err
	}
	// One bad address condemns the name: a resolver that mixes a public
	// address with 127.0.0.1 is exactly what a rebinding attack looks like.
	for _, a := range addrs {
		if addrBlocked(a, s.opts.AllowedPrivate) {
			return t, ReasonPrivate, fmt.Errorf("%s resolves to %s", name, a)
		}
	}
	t.addrs = addrs
	return t, "", nil
}

// deny records a policy refusal for the run and tells the client why: the
// reason goes into the status text (all a CONNECT client may show) and the
// body.
func (s *Server) deny(ss *session, t target, reason string, detail error) {
	ss.set(decisionDeny, reason, detail)
	s.recordDenial(ss.reg, Denial{Host: t.host, Port: t.port, Reason: reason})
}

func (s *Server) denyResponse(ss *session, t target, reason string, detail error) {
	s.deny(ss, t, reason, detail)
	writeResponse(ss.client, http.StatusForbidden, "Forbidden ("+reason+")",
		fmt.Sprintf("egress denied: %s: %s", net.JoinHostPort(t.host, strconv.Itoa(t.port)), reason))
	lingerClose(ss.client.Conn)
}

// dial connects to the first vetted address that answers, by IP, so a
// second DNS answer can never swap the destination after it was checked.
func (s *Server) dial(ss *session, t target) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.DialTimeout)
	defer cancel()
	var errs []error
	for _, a := range t.addrs {
		c, err := s.opts.Dialer(ctx, "tcp", netip.AddrPortFrom(a, uint16(t.port)).String())
		if err == nil {
			return &meteredConn{Conn: c, read: &ss.down, written: &ss.up, touch: ss.touch}, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		errs = append(errs, fmt.Errorf("dial timeout %s: %w", s.opts.DialTimeout, ctx.Err()))
	}
	return nil, fmt.Errorf("connecting to %s: %w", t.host, errors.Join(errs...))
}

// dialFailed answers a dial error with 504 for timeouts, 502 otherwise.
func (s *Server) dialFailed(ss *session, t target, err error) {
	ss.set(decisionError, "upstream unreachable", err)
	code, text := http.StatusBadGateway, "Bad Gateway"
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		code, text = http.StatusGatewayTimeout, "Gateway Timeout"
	}
	writeResponse(ss.client, code, text, fmt.Sprintf("egress: cannot reach %s: %v", net.JoinHostPort(t.host, strconv.Itoa(t.port)), err))
	lingerClose(ss.client.Conn)
}

func (s *Server) serveConnect(ss *session, req *http.Request, br *bufio.Reader) {
	bad := func(why string) {
		ss.set(decisionReject, why, nil)
		writeResponse(ss.client, http.StatusBadRequest, "Bad Request", "egress: "+why)
		lingerClose(ss.client.Conn)
	}
	if req.URL.Host == "" || req.URL.Path != "" || req.URL.RawQuery != "" {
		bad("CONNECT needs an authority target: CONNECT host:port")
		return
	}
	host, portStr, err := net.SplitHostPort(req.URL.Host)
	if err != nil {
		bad("CONNECT needs an authority target: CONNECT host:port")
		return
	}
	port, ok := parsePort(portStr)
	if !ok || host == "" {
		bad(fmt.Sprintf("CONNECT target %q: bad host or port", req.URL.Host))
		return
	}
	ss.host, ss.port = host, port
	t, ok := s.check(ss, host, port)
	if !ok {
		return
	}
	if ss.reg.policy.needsInterception(t.host) {
		if s.opts.CA == nil {
			ss.set(decisionError, "no interception CA", nil)
			writeResponse(ss.client, http.StatusBadGateway, "Bad Gateway", "egress: requests to "+t.host+" must be inspected, and this proxy has no CA to intercept them")
			lingerClose(ss.client.Conn)
			return
		}
		s.intercept(ss, t, br)
		return
	}
	up, ok := s.connect(ss, t)
	if !ok {
		return
	}
	if _, err := io.WriteString(ss.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		ss.set(decisionError, "client write failed", err)
		return
	}
	s.tunnel(ss, t, br, up)
}

// tunnel checks the first client bytes, then splices both ways until
// either side is done or the tunnel has been idle for IdleTimeout.
//
// Every tunnel, whatever its port, must begin with a TLS ClientHello whose
// SNI names the CONNECT host; nothing reaches upstream before that. A
// tunnel of bytes the proxy cannot read would carry anything to an
// allowed address: plain HTTP with another name in its Host header
// reaches every site of a shared front end (a CDN, a virtual host). Plain
// HTTP goes through the absolute-URI form, whose Host the proxy sets.
func (s *Server) tunnel(ss *session, t target, br *bufio.Reader, up net.Conn) {
	stop := s.startIdleTimer(ss)
	defer stop()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(ss.client, up); err != nil {
			ss.abort()
			return
		}
		closeWrite(ss.client)
	}()
	defer wg.Wait()

	ss.set(decisionAllow, "", nil)
	_ = ss.client.SetReadDeadline(time.Now().Add(s.opts.HelloTimeout))
	peeked, hello, err := readClientHello(br)
	if err != nil {
		s.deny(ss, t, ReasonSNI, fmt.Errorf("a CONNECT tunnel must start with a TLS ClientHello (send plain HTTP as GET http://host/...): %w", err))
		ss.abort()
		return
	}
	if !sniMatches(hello.serverName, t) {
		s.deny(ss, t, ReasonSNI, fmt.Errorf("SNI %q, CONNECT host %q", hello.serverName, t.host))
		ss.abort()
		return
	}
	_ = ss.client.SetReadDeadline(time.Time{})
	if _, err := up.Write(peeked); err != nil {
		ss.set(decisionError, "upstream write failed", err)
		ss.abort()
		return
	}
	if _, err := io.Copy(up, br); err != nil {
		ss.abort()
		return
	}
	closeWrite(up)
}

// sniMatches requires the SNI to name the CONNECT host. A client tunnelling
// to an IP literal cannot send an SNI (RFC 6066 forbids addresses there),
// so for literals the SNI must be absent.
func sniMatches(sni string, t target) bool {
	if t.literal {
		return sni == ""
	}
	name, err := normalizeName(sni)
	return err == nil && name == t.host
}

func (s *Server) serveHTTP(ss *session, req *http.Request, br *bufio.Reader) {
	bad := func(why string) {
		ss.set(decisionReject, why, nil)
		writeResponse(ss.client, http.StatusBadRequest, "Bad Request", "egress: "+why)
		lingerClose(ss.client.Conn)
	}
	u := req.URL
	switch {
	case strings.EqualFold(u.Scheme, "https"):
		bad("send https:// requests through CONNECT host:443, not as an absolute URI")
		return
	case !strings.EqualFold(u.Scheme, "http"):
		bad(fmt.Sprintf("scheme %q is not supported; only http:// URIs and CONNECT", u.Scheme))
		return
	case u.Hostname() == "":
		bad("absolute URI without a host")
		return
	}
	port := 80
	if p := u.Port(); p != "" {
		var ok bool
		if port, ok = parsePort(p); !ok {
			bad(fmt.Sprintf("bad port %q", p))
			return
		}
	}
	ss.host, ss.port = u.Hostname(), port
	t, ok := s.check(ss, u.Hostname(), port)
	if !ok {
		return
	}
	if ref, _ := s.inspect(ss, t, req, false); ref != nil {
		ss.set(decisionDeny, ref.reason, nil)
		writeResponse(ss.client, ref.code, http.StatusText(ref.code)+" ("+ref.reason+")", ref.msg)
		lingerClose(ss.client.Conn)
		return
	}
	up, ok := s.connect(ss, t)
	if !ok {
		return
	}
	stop := s.startIdleTimer(ss)
	defer stop()

	out := req.Clone(context.Background())
	out.Body = req.Body // Clone keeps it, but say so: the body streams from the client
	out.RequestURI = ""
	out.Host = u.Host // the URI's authority, never the client's Host header (RFC 9112 §3.2.2)
	removeHopByHop(out.Header)
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // keep Go from inventing one
	}
	out.Close = true // one request per upstream connection

	// Write the request while reading the response, so an upstream that
	// answers early (413, 401) is heard even if the body is still coming.
	writeErr := make(chan error, 1)
	go func() { writeErr <- out.Write(up) }()

	resp, err := s.readResponse(up, out, ss.client)
	if err != nil {
		ss.set(decisionError, "bad upstream response", err)
		writeResponse(ss.client, http.StatusBadGateway, "Bad Gateway", "egress: "+err.Error())
		endExchange(ss, up, br, writeErr)
		return
	}
	ss.set(decisionAllow, "", nil)
	bw := bufio.NewWriter(ss.client)
	removeHopByHop(resp.Header)
	resp.Close = true
	err = resp.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		ss.setDetail(fmt.Errorf("relaying response: %w", err))
	}
	_ = resp.Body.Close()
	endExchange(ss, up, br, writeErr)
}

// lingerTimeout bounds how long a finished exchange waits for the client to
// close, or for the rest of a request body nobody will read.
const lingerTimeout = 500 * time.Millisecond

// endExchange finishes a plain HTTP exchange whose response has been sent.
// Closing at once could make the kernel answer unread request bytes (a body
// the upstream did not wait for) with a reset that destroys the response
// before the client reads it; so the proxy half-closes, lets the request
// writer drain what the client still sends for a moment, and only then
// closes.
func endExchange(ss *session, up net.Conn, br *bufio.Reader, writeErr <-chan error) {
	_ = up.Close() // fails the request writer's next upstream write
	closeWrite(ss.client)
	_ = ss.client.SetReadDeadline(time.Now().Add(lingerTimeout))
	<-writeErr
	_, _ = io.Copy(io.Discard, br) // until the client closes or the deadline

}

// readResponse reads the upstream response head under
// MaxResponseHeaderBytes, passes 1xx interim responses (100 Continue) on to
// the client, and returns the final one.
func (s *Server) readResponse(up net.Conn, req *http.Request, client io.Writer) (*http.Response, error) {
	lr := &io.LimitedReader{R: up}
	br := bufio.NewReader(lr)
	for {
		lr.N = int64(s.opts.MaxResponseHeaderBytes)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			if lr.N <= 0 {
				return nil, fmt.Errorf("upstream response header exceeds %d bytes", s.opts.MaxResponseHeaderBytes)
			}
			return nil, fmt.Errorf("reading upstream response: %w", err)
		}
		lr.N = math.MaxInt64
		switch {
		case resp.StatusCode >= 200:
			return resp, nil
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("upstream switched protocols, which this proxy does not relay")
		}
		removeHopByHop(resp.Header)
		bw := bufio.NewWriter(client)
		_, _ = fmt.Fprintf(bw, "HTTP/1.1 %03d %s\r\n", resp.StatusCode, http.StatusText(resp.StatusCode))
		_ = resp.Header.Write(bw)
		_, _ = bw.WriteString("\r\n")
		if err := bw.Flush(); err != nil {
			return nil, fmt.Errorf("relaying interim response: %w", err)
		}
	}
}

// hopByHop are headers that describe one connection, not the message
// (RFC 9110 §7.6.1); a proxy must not forward them.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade",
}

// removeHopByHop deletes hop-by-hop headers, those named in Connection, and
// every Proxy-* header (credentials meant for this proxy must not leak
// upstream).
func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "Proxy-") {
			delete(h, k)
		}
	}
}

// writeResponse sends a short plain-text response that ends the exchange.
func writeResponse(w io.Writer, code int, statusText, body string) {
	body += "\n"
	_, _ = fmt.Fprintf(w, "HTTP/1.1 %03d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, statusText, len(body), body)
}

// lingerClose half-closes c and drains it for at most lingerTimeout before
// closing, so the client reads our response instead of a reset caused by
// request bytes we never read. The drain is bounded by time, not bytes: a
// byte cap would bring back the reset it is there to avoid.
func lingerClose(c net.Conn) {
	closeWrite(c)
	_ = c.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.Copy(io.Discard, c)
	_ = c.Close()
}

// closeWrite half-closes c when it supports that, and closes it otherwise.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

func remoteAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func parsePort(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || strings.HasPrefix(s, "+") {
		return 0, false
	}
	return n, true
}

// meteredConn counts bytes and marks activity for the idle timer.
type meteredConn struct {
	net.Conn
	read, written *atomic.Int64 // nil: not counted
	touch         func()
}

func (c *meteredConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if c.read != nil {
			c.read.Add(int64(n))
		}
		c.touch()
	}
	return n, err
}

func (c *meteredConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		if c.written != nil {
			c.written.Add(int64(n))
		}
		c.touch()
	}
	return n, err
}

// CloseWrite half-closes the underlying connection when it can.
func (c *meteredConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// startIdleTimer aborts ss after IdleTimeout without traffic either way. A
// single timer that re-arms itself for the remaining time is cheaper than
// pushing read deadlines on every read, and sees both directions at once.
func (s *Server) startIdleTimer(ss *session) (stop func()) {
	ss.touch()
	idle := s.opts.IdleTimeout
	var t *time.Timer
	var mu sync.Mutex
	stopped := false
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		since := time.Since(time.Unix(0, ss.lastActive.Load()))
		if since >= idle {
			ss.idled.Store(true)
			ss.abort()
			return
		}
		t.Reset(idle - since)
	}
	mu.Lock()
	t = time.AfterFunc(idle, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
