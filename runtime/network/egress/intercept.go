package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"
)

// errSNIMismatch fails an intercepted handshake whose SNI names another
// host than the CONNECT target.
var errSNIMismatch = errors.New("SNI does not name the CONNECT host")

// errEncodedResponse refuses a response the proxy would have to redact
// but cannot read.
var errEncodedResponse = errors.New("the upstream sent a compressed response to a request that carried a secret; it cannot be checked for the secret's value, so it is not relayed")

// redactKey carries a request's redaction needles to ModifyResponse.
type redactKey struct{}

// intercept terminates the sandbox's TLS for t with a leaf certificate
// the run's CA signed, and serves the HTTP/1.1 or HTTP/2 requests inside
// it: each is inspected (rules, secrets, tripwires) and forwarded over
// the proxy's own TLS connection to the vetted address, whose certificate
// is verified against UpstreamRoots. Only hosts whose policy needs to
// read requests come here; the rest stay blind tunnels.
func (s *Server) intercept(ss *session, t target, br *bufio.Reader) {
	ss.intercepted = true
	if _, err := io.WriteString(ss.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		ss.set(decisionError, "client write failed", err)
		return
	}
	stop := s.startIdleTimer(ss)
	defer stop()
	leaf, err := s.opts.CA.leaf(t.host)
	if err != nil {
		ss.set(decisionError, "leaf certificate", err)
		return
	}
	cfg := &tls.Config{
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if !sniMatches(hello.ServerName, t) {
				return nil, fmt.Errorf("%w: SNI %q, CONNECT host %q", errSNIMismatch, hello.ServerName, t.host)
			}
			return leaf, nil
		},
		NextProtos: []string{"h2", "http/1.1"},
		MinVersion: tls.VersionTLS12,
	}
	_ = ss.client.SetReadDeadline(time.Now().Add(s.opts.HelloTimeout))
	tc := tls.Server(&bufferedConn{Conn: ss.client, r: br}, cfg)
	if err := tc.HandshakeContext(s.ctx); err != nil {
		if errors.Is(err, errSNIMismatch) {
			s.deny(ss, t, ReasonSNI, err)
		} else {
			ss.set(decisionReject, "TLS handshake with the sandbox failed", err)
		}
		return
	}
	_ = ss.client.SetReadDeadline(time.Time{})
	ss.set(decisionAllow, "", nil)

	// Upgrades (WebSocket) need HTTP/1.1 upstream: a connection that
	// negotiated h2 cannot carry them.
	h2, h1 := s.upstreamTransport(ss, t, true), s.upstreamTransport(ss, t, false)
	defer h2.CloseIdleConnections()
	defer h1.CloseIdleConnections()
	transport := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		// The last look, at what is really sent: the request as
		// ReverseProxy rebuilt it (it re-encodes the query).
		if c := ss.reg.policy.creds; c != nil && len(c.trips) > 0 && tripped(c.trips, t, r) != "" {
			where, _ := r.Context().Value(whereKey{}).(Denial)
			s.report(ss, where, ReasonTripwire)
			return nil, errStopped
		}
		if r.Header.Get("Upgrade") != "" {
			return h1.RoundTrip(r)
		}
		return h2.RoundTrip(r)
	})
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = authority(t)
			pr.Out.Host = ""
		},
		Transport:      transport,
		ModifyResponse: modifyResponse,
		ErrorLog:       log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errStopped) || errors.Is(r.Context().Err(), context.Canceled) {
				return
			}
			// An upstream error may quote the rewritten request: it goes
			// to the sandbox and the log only with the secrets put back
			// as placeholders.
			redact, _ := r.Context().Value(redactKey{}).([]needle)
			msg := redactString(err.Error(), redact)
			ss.setDetail(errors.New(msg))
			http.Error(w, "egress: "+msg, http.StatusBadGateway)
		},
	}
	var handlers activity
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !handlers.enter() {
			return // the connection is being wound up
		}
		defer handlers.leave()
		ss.requests.Add(1)
		if !authorityMatches(r.Host, t) {
			s.report(ss, Denial{Host: t.host, Port: t.port, Method: r.Method, Path: r.URL.Path}, ReasonSNI)
			http.Error(w, fmt.Sprintf("egress: this connection is for %s; the request names %q", authority(t), r.Host), http.StatusMisdirectedRequest)
			return
		}
		ref, redact := s.inspect(ss, t, r, true)
		if ref != nil {
			ss.set(decisionDeny, ref.reason, nil)
			w.Header().Set("Connection", "close")
			http.Error(w, ref.msg, ref.code)
			return
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), redactKey{}, redact)))
	})
	l := &oneConnListener{c: tc, done: make(chan struct{})}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: s.opts.HeaderTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    s.opts.MaxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
		// Each stream may open an upstream connection (an HTTP/1.1
		// upstream): bounded, with the transports' MaxConnsPerHost.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxStreams},
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				l.Close()
			}
		},
	}
	_ = srv.Serve(l)
	handlers.drain() // a hijacked (WebSocket) exchange outlives the conn state
}

// maxStreams bounds the HTTP/2 streams of one intercepted connection, and
// the upstream connections it may open at once.
const maxStreams = 16

// activity counts the handlers of one intercepted connection, so that
// it is wound up only when the last has returned, and none starts after.
type activity struct {
	mu       sync.Mutex
	active   int
	draining bool
	idle     *sync.Cond
}

func (a *activity) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining {
		return false
	}
	a.active++
	return true
}

func (a *activity) leave() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.active--
	if a.active == 0 && a.idle != nil {
		a.idle.Broadcast()
	}
}

// drain refuses new handlers and waits for the running ones.
func (a *activity) drain() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.draining = true
	if a.idle == nil {
		a.idle = sync.NewCond(&a.mu)
	}
	for a.active > 0 {
		a.idle.Wait()
	}
}

// modifyResponse redacts the secrets the request carried from the
// response before it reaches the sandbox: headers, body, and the stream
// of an upgraded (WebSocket) connection; trailers, which would come after
// the body unsearched, are dropped.
func modifyResponse(resp *http.Response) error {
	redact, _ := resp.Request.Context().Value(redactKey{}).([]needle)
	if len(redact) == 0 {
		return nil
	}
	for _, ce := range resp.Header.Values("Content-Encoding") {
		for _, enc := range strings.Split(ce, ",") {
			if e := strings.TrimSpace(enc); e != "" && !strings.EqualFold(e, "identity") {
				return errEncodedResponse
			}
		}
	}
	redactHeader(resp.Header, redact)
	resp.Header.Del("Trailer")
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = &upgradedStream{ReadCloser: newScanner(rwc, redact), w: rwc}
		}
		return nil
	}
	resp.Body = &dropTrailers{ReadCloser: newScanner(resp.Body, redact), resp: resp}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return nil
}

// dropTrailers empties a response's trailers once its body has been read:
// the transport fills them in at the body's end, after any check, and
// ReverseProxy would pass them on.
type dropTrailers struct {
	io.ReadCloser
	resp *http.Response
}

func (d *dropTrailers) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err != nil {
		d.resp.Trailer = nil
	}
	return n, err
}

// upgradedStream is an upgraded connection whose upstream-to-sandbox
// bytes pass a scanner; what the sandbox writes goes straight through.
type upgradedStream struct {
	io.ReadCloser
	w io.Writer
}

func (u *upgradedStream) Write(p []byte) (int, error) { return u.w.Write(p) }

// upstreamTransport dials t's vetted addresses (never the name) and
// verifies the upstream's certificate for t.host.
func (s *Server) upstreamTransport(ss *session, t target, h2 bool) *http.Transport {
	protos := []string{"http/1.1"}
	if h2 {
		protos = []string{"h2", "http/1.1"}
	}
	return &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := s.dial(ss, t)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{
				ServerName: t.host,
				RootCAs:    s.opts.UpstreamRoots,
				NextProtos: protos,
				MinVersion: tls.VersionTLS12,
			})
			hctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				_ = c.Close()
				return nil, fmt.Errorf("TLS to %s: %w", t.host, err)
			}
			return tc, nil
		},
		ForceAttemptHTTP2:      h2,
		MaxConnsPerHost:        maxStreams,
		DisableCompression:     true,
		MaxResponseHeaderBytes: int64(s.opts.MaxResponseHeaderBytes),
		IdleConnTimeout:        s.opts.IdleTimeout,
		ResponseHeaderTimeout:  s.opts.IdleTimeout,
	}
}

// authority is t as a request's Host: the port only when not 443.
func authority(t target) string {
	h := t.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if t.port == 443 {
		return h
	}
	return h + ":" + strconv.Itoa(t.port)
}

// authorityMatches requires a request inside an intercepted connection
// to name the connection's host (and port, if it names one): otherwise
// one allowed name's connection would carry requests for another site of
// the same front end.
func authorityMatches(hostport string, t target) bool {
	host, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	}
	if port != "" && port != strconv.Itoa(t.port) {
		return false
	}
	if t.literal {
		return strings.Trim(host, "[]") == t.host
	}
	name, err := normalizeName(host)
	return err == nil && name == t.host
}

// bufferedConn reads what the request reader already buffered (an eager
// ClientHello) before the connection itself.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConnListener hands one connection to an http.Server, then blocks
// until Close.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	shut sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.shut.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// roundTripFunc is a function as an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
