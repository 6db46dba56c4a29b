package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every test server and every dial in these tests stays on 127.0.0.0/8.
// The test dialer enforces that, so a bug in the proxy can never send
// traffic off the machine: a non-loopback dial fails and is recorded.

var loopback = netip.MustParsePrefix("127.0.0.0/8")

// harness is a running proxy with a recording dialer and captured logs.
type harness struct {
	t    testing.TB
	srv  *Server
	addr string

	mu     sync.Mutex
	dialed []string          // every address the proxy asked to dial
	remap  map[string]string // dial address -> real test server address
	logs   syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newHarness starts a proxy. Unless opts say otherwise it pins
// "allowed.test" to 127.0.0.1 and exempts 127.0.0.0/8, as a test site would.
func newHarness(t testing.TB, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, remap: map[string]string{}}
	if opts.Hosts == nil {
		opts.Hosts = map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}}
	}
	if opts.AllowedPrivate == nil {
		opts.AllowedPrivate = []netip.Prefix{loopback}
	}
	inner := opts.Dialer
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.mu.Lock()
		h.dialed = append(h.dialed, addr)
		if r, ok := h.remap[addr]; ok {
			addr = r
		}
		h.mu.Unlock()
		if inner != nil {
			return inner(ctx, network, addr)
		}
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || !loopback.Contains(ap.Addr()) {
			return nil, fmt.Errorf("test dialer refuses non-loopback address %q", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	opts.Logger = slog.New(slog.NewJSONHandler(&h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	h.srv, h.addr = srv, addr.String()
	return h
}

func (h *harness) dials() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.dialed...)
}

func (h *harness) mapDial(from, to string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.remap[from] = to
}

// register binds src to run under a policy built from the arguments.
func (h *harness) register(src, run string, domains []string, ports []int, cidrs []string) func() {
	h.t.Helper()
	p, err := ParsePolicy(domains, ports, cidrs)
	if err != nil {
		h.t.Fatalf("ParsePolicy: %v", err)
	}
	return h.srv.Register(netip.MustParseAddr(src), run, p)
}

// dialFrom connects to the proxy from a chosen loopback source address;
// Linux accepts any 127.x source on lo, which lets one test be several
// sandboxes.
func (h *harness) dialFrom(src string) net.Conn {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatalf("dial proxy from %s: %v", src, err)
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	h.t.Cleanup(func() { _ = c.Close() })
	return c
}

// bufConn is a conn whose reads go through the bufio.Reader that parsed
// the proxy's response, so no byte read ahead is lost.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// raw sends a raw request from src and returns the proxy's response with
// its body read.
func (h *harness) raw(src, request string) (*http.Response, string) {
	h.t.Helper()
	c := h.dialFrom(src)
	if _, err := io.WriteString(c, request); err != nil {
		h.t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		h.t.Fatalf("read response: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = c.Close() // lets the proxy finish its lingering close at once
	return resp, string(body)
}

// connect sends CONNECT target from src and returns the tunnel (valid when
// the status is 200) and the response.
func (h *harness) connect(src, target string) (net.Conn, *http.Response) {
	h.t.Helper()
	c := h.dialFrom(src)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		h.t.Fatalf("read CONNECT response: %v", err)
	}
	return &bufConn{Conn: c, r: br}, resp
}

// client returns an http.Client that uses the proxy from src, the way a
// program in a sandbox would.
func (h *harness) client(src string, roots *x509.CertPool) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{
			Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr}),
			DialContext:       d.DialContext,
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true,
		},
	}
}

// logRecords returns the JSON log records whose message is msg.
func (h *harness) logRecords(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			h.t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// waitLogs waits until n connection records have been logged.
func (h *harness) waitLogs(n int) []map[string]any {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs := h.logRecords("egress connection")
		if len(recs) >= n || time.Now().After(deadline) {
			if len(recs) < n {
				h.t.Fatalf("want %d connection log records, have %d:\n%s", n, len(recs), h.logs.String())
			}
			return recs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// port returns the port of a "host:port" or URL string.
func port(t *testing.T, s string) int {
	t.Helper()
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		s = u.Host
	}
	_, p, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("split %q: %v", s, err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// testCert is a self-signed certificate valid for allowed.test and
// other.test, so that a failed SNI test proves the proxy refused, not the
// certificate check.
type testCert struct {
	tls   tls.Certificate
	roots *x509.CertPool
}

var (
	certOnce sync.Once
	cert     testCert
)

func getCert(t *testing.T) testCert {
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "airlock egress test"},
			DNSNames:              []string{"allowed.test", "other.test", "sub.allowed.test"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(24 * time.Hour),
			KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IsCA:                  true,
			BasicConstraintsValid: true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			panic(err)
		}
		cert.roots = x509.NewCertPool()
		cert.roots.AddCert(leaf)
		cert.tls = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	})
	return cert
}

// newTLSServer starts an HTTPS server on 127.0.0.1 with the test cert.
func newTLSServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{getCert(t).tls}}
	// Handshakes the proxy cuts short are expected; keep them out of the output.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// countingListener accepts connections on 127.0.0.1 and counts the bytes
// they receive, standing in for an upstream that must hear nothing.
type countingListener struct {
	ln    net.Listener
	conns atomic.Int64
	bytes atomic.Int64
	echo  bool
}

func newCountingListener(t *testing.T, echo bool) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{ln: ln, echo: echo}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cl.conns.Add(1)
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					cl.bytes.Add(int64(n))
					if n > 0 && cl.echo {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return cl
}

func (cl *countingListener) addr() string { return cl.ln.Addr().String() }

// captureHello returns the first TLS record(s) a crypto/tls client sends:
// its ClientHello.
func captureHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	c1, c2 := net.Pipe()
	defer c2.Close()
	go func() {
		_ = tls.Client(c1, cfg).Handshake()
		c1.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c2, hdr); err != nil {
		t.Fatalf("capture hello header: %v", err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(c2, body); err != nil {
		t.Fatalf("capture hello body: %v", err)
	}
	return append(hdr, body...)
}

// refragment re-frames one handshake record into records of at most size
// payload bytes each, as a client may legally send.
func refragment(rec []byte, size int) []byte {
	payload := rec[5:]
	var out []byte
	for len(payload) > 0 {
		n := min(size, len(payload))
		out = append(out, rec[0], rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, payload[:n]...)
		payload = payload[n:]
	}
	return out
}

// fragmentingConn rewrites the client's first write (the ClientHello) into
// small TLS records and sends them in pieces with pauses, so the proxy sees
// the hello split across both records and TCP reads.
type fragmentingConn struct {
	net.Conn
	recordSize, chunk int
	done              bool
}

func (c *fragmentingConn) Write(p []byte) (int, error) {
	if c.done {
		return c.Conn.Write(p)
	}
	c.done = true
	data := p
	if c.recordSize > 0 {
		data = refragment(p, c.recordSize)
	}
	for len(data) > 0 {
		n := min(c.chunk, len(data))
		if _, err := c.Conn.Write(data[:n]); err != nil {
			return 0, err
		}
		data = data[n:]
		time.Sleep(2 * time.Millisecond)
	}
	return len(p), nil
}

// echoHandler reports what the upstream saw, so tests can check what the
// proxy forwarded.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("X-Seen-Host", r.Host)
	w.Header().Set("X-Seen-URI", r.RequestURI)
	hdr, _ := json.Marshal(r.Header)
	w.Header().Set("X-Seen-Headers", string(hdr))
	fmt.Fprintf(w, "%s %s body=%q", r.Method, r.URL.Path, body)
}

// newTLSEcho starts a TLS echo server on 127.0.0.1 with the test cert.
func newTLSEcho(t *testing.T) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{getCert(t).tls}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// tlsTunnel CONNECTs from src to allowed.test at addr's port and shakes
// hands through the tunnel.
func (h *harness) tlsTunnel(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	tun, resp := h.connect(src, "allowed.test:"+strconv.Itoa(port(t, addr)))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	c := tls.Client(tun, &tls.Config{ServerName: "allowed.test", RootCAs: getCert(t).roots})
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake through the tunnel: %v", err)
	}
	return c
}
