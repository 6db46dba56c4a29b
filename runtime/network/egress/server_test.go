package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/airlock-mcp/airlock/metrics"
)

const src = "127.0.0.1"

func TestHTTPForward(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	h := newHarness(t, Options{})
	upPort := port(t, up.URL)
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)

	t.Run("client library", func(t *testing.T) {
		resp, err := h.client(src, nil).Post(fmt.Sprintf("http://allowed.test:%d/upload?x=1", upPort), "text/plain", strings.NewReader("hello upstream"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != `POST /upload body="hello upstream"` {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Seen-URI"); got != "/upload?x=1" {
			t.Errorf("upstream saw request URI %q, want origin form /upload?x=1", got)
		}
	})

	t.Run("chunked body", func(t *testing.T) {
		resp, body := h.raw(src, fmt.Sprintf("POST http://allowed.test:%d/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n", upPort))
		if resp.StatusCode != 200 || body != `POST /c body="abcdefg"` {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
	})

	t.Run("unread client bytes do not reset the response", func(t *testing.T) {
		// Bytes the proxy never reads (here, a pipelined second request
		// far larger than any buffer) would make an abrupt close send a
		// reset that can destroy the response before the client reads it.
		c := h.dialFrom(src)
		junk := strings.Repeat("x", 4<<20)
		go func() {
			io.WriteString(c, fmt.Sprintf("GET http://allowed.test:%d/first HTTP/1.1\r\n\r\n", upPort)+junk)
		}()
		time.Sleep(100 * time.Millisecond) // the junk is in flight when the response is done
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != `GET /first body=""` {
			t.Errorf("body %q, %v", body, err)
		}
	})

	t.Run("headers", func(t *testing.T) {
		req := fmt.Sprintf("GET http://allowed.test:%d/path HTTP/1.1\r\n"+
			"Host: spoofed.example\r\n"+
			"Proxy-Authorization: Basic c2VjcmV0\r\n"+
			"Proxy-Connection: keep-alive\r\n"+
			"Connection: X-Hop, keep-alive\r\n"+
			"X-Hop: drop me\r\n"+
			"Keep-Alive: 300\r\n"+
			"Upgrade: websocket\r\n"+
			"X-Keep: kept\r\n"+
			"\r\n", upPort)
		resp, body := h.raw(src, req)
		if resp.StatusCode != 200 || body != `GET /path body=""` {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if got, want := resp.Header.Get("X-Seen-Host"), fmt.Sprintf("allowed.test:%d", upPort); got != want {
			t.Errorf("upstream Host = %q, want the URI's authority %q", got, want)
		}
		var seen map[string][]string
		if err := json.Unmarshal([]byte(resp.Header.Get("X-Seen-Headers")), &seen); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"Proxy-Authorization", "Proxy-Connection", "X-Hop", "Keep-Alive", "Upgrade"} {
			if _, ok := seen[k]; ok {
				t.Errorf("upstream received hop-by-hop header %s", k)
			}
		}
		if c := seen["Connection"]; !slices.Equal(c, []string{"close"}) {
			t.Errorf("upstream Connection = %q, want only the proxy's own close", c)
		}
		if seen["X-Keep"] == nil {
			t.Error("an end-to-end header was dropped")
		}
		if _, ok := seen["User-Agent"]; ok {
			t.Error("the proxy invented a User-Agent")
		}
	})

	// The proxy dialed the vetted IP, never the name.
	for _, d := range h.dials() {
		if ap, err := netip.ParseAddrPort(d); err != nil || ap.Addr() != netip.MustParseAddr("127.0.0.1") {
			t.Errorf("dialed %q, want the vetted address 127.0.0.1", d)
		}
	}
	if len(h.srv.Denials("run1")) != 0 {
		t.Errorf("unexpected denials: %v", h.srv.Denials("run1"))
	}
}

func TestHTTPResponseHeaders(t *testing.T) {
	// Go's own server rewrites Connection, so this upstream is raw TCP.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n"+
			"Connection: X-Resp-Hop, keep-alive\r\n"+
			"X-Resp-Hop: drop me\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"Proxy-Thing: drop me\r\n"+
			"X-Keep: kept\r\n"+
			"Transfer-Encoding: chunked\r\n"+
			"\r\n"+
			"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
	}()
	h := newHarness(t, Options{})
	upPort := port(t, ln.Addr().String())
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
	resp, body := h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort))
	if resp.StatusCode != 200 || body != "hello world" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	for _, k := range []string{"X-Resp-Hop", "Keep-Alive", "Proxy-Thing"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("client received hop-by-hop response header %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-Keep") != "kept" || !resp.Close {
		t.Errorf("headers %v, close %v", resp.Header, resp.Close)
	}
}

func TestHTTPExpectContinue(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	h := newHarness(t, Options{})
	upPort := port(t, up.URL)
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)

	c := h.dialFrom(src)
	fmt.Fprintf(c, "PUT http://allowed.test:%d/x HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n", upPort)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("want 100 Continue relayed first, got %q, %v", line, err)
	}
	for line != "\r\n" {
		if line, err = br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	io.WriteString(c, "data")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != `PUT /x body="data"` {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}

func TestConnectTLS(t *testing.T) {
	up := newTLSServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "secret page for %s", r.TLS.ServerName)
	}))
	upPort := port(t, up.URL)
	roots := getCert(t).roots

	get := func(t *testing.T, h *harness, url string) string {
		t.Helper()
		resp, err := h.client(src, roots).Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
		}
		return string(body)
	}

	t.Run("port 443", func(t *testing.T) {
		// The policy allows 443 and the dialer sends 127.0.0.1:443 to the
		// test server's real port: the default TLSPorts path.
		h := newHarness(t, Options{})
		h.mapDial("127.0.0.1:443", up.Listener.Addr().String())
		h.register(src, "run1", []string{"allowed.test"}, nil, nil)
		if got := get(t, h, "https://allowed.test/"); got != "secret page for allowed.test" {
			t.Errorf("body %q", got)
		}
		if d := h.dials(); !slices.Equal(d, []string{"127.0.0.1:443"}) {
			t.Errorf("dials %q", d)
		}
		recs := h.waitLogs(1)
		if recs[0]["decision"] != "allow" || recs[0]["bytes_up"].(float64) == 0 || recs[0]["bytes_down"].(float64) == 0 {
			t.Errorf("log record %v", recs[0])
		}
	})
	t.Run("high port, SNI checked because the client speaks TLS", func(t *testing.T) {
		h := newHarness(t, Options{})
		h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
		if got := get(t, h, fmt.Sprintf("https://allowed.test:%d/", upPort)); got != "secret page for allowed.test" {
			t.Errorf("body %q", got)
		}
	})
	t.Run("wildcard and case", func(t *testing.T) {
		h := newHarness(t, Options{Hosts: map[string][]netip.Addr{"SUB.allowed.test.": {netip.MustParseAddr("127.0.0.1")}}})
		h.register(src, "run1", []string{"*.allowed.test"}, []int{upPort}, nil)
		if got := get(t, h, fmt.Sprintf("https://Sub.Allowed.Test:%d/", upPort)); !strings.EqualFold(got, "secret page for sub.allowed.test") {
			t.Errorf("body %q", got)
		}
	})
	for _, tc := range []struct {
		name              string
		recordSize, chunk int
	}{
		{"hello split across TCP reads", 0, 9},
		{"hello split across TLS records", 40, 1 << 20},
		{"both", 25, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			h.mapDial("127.0.0.1:443", up.Listener.Addr().String())
			h.register(src, "run1", []string{"allowed.test"}, nil, nil)
			tun, resp := h.connect(src, "allowed.test:443")
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			fc := &fragmentingConn{Conn: tun, recordSize: tc.recordSize, chunk: tc.chunk}
			tc := tls.Client(fc, &tls.Config{ServerName: "allowed.test", RootCAs: roots, NextProtos: []string{"http/1.1"}})
			if err := tc.Handshake(); err != nil {
				t.Fatalf("handshake through the proxy: %v", err)
			}
			io.WriteString(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
			r, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(r.Body)
			if string(body) != "secret page for allowed.test" {
				t.Errorf("body %q", body)
			}
		})
	}
}

// tlsThroughProxy runs a TLS handshake over CONNECT target and returns its
// error.
func tlsThroughProxy(t *testing.T, h *harness, target string, cfg *tls.Config) error {
	t.Helper()
	tun, resp := h.connect(src, target)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	return tls.Client(tun, cfg).Handshake()
}

func TestSNI(t *testing.T) {
	up := newTLSServer(t, http.HandlerFunc(echoHandler))
	upPort := port(t, up.URL)
	roots := getCert(t).roots
	tests := []struct {
		name   string
		target string
		cfg    *tls.Config
	}{
		// The certificate is valid for other.test too, so only the proxy
		// can be what stops this handshake.
		{"mismatch on 443", "allowed.test:443", &tls.Config{ServerName: "other.test", RootCAs: roots}},
		{"mismatch on another port", fmt.Sprintf("allowed.test:%d", upPort), &tls.Config{ServerName: "other.test", RootCAs: roots}},
		{"missing", "allowed.test:443", &tls.Config{InsecureSkipVerify: true}},
		{"suffix trick", "allowed.test:443", &tls.Config{ServerName: "allowed.test.other.test", InsecureSkipVerify: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			h.mapDial("127.0.0.1:443", up.Listener.Addr().String())
			h.register(src, "run1", []string{"allowed.test", "other.test"}, []int{443, upPort}, nil)
			if err := tlsThroughProxy(t, h, tt.target, tt.cfg); err == nil {
				t.Fatal("handshake succeeded; the proxy must cut it")
			}
			p := port(t, tt.target)
			want := []Denial{{Host: "allowed.test", Port: p, Reason: ReasonSNI}}
			if got := h.srv.Denials("run1"); !slices.Equal(got, want) {
				t.Errorf("Denials = %v, want %v", got, want)
			}
		})
	}

	t.Run("IP literal needs no SNI", func(t *testing.T) {
		h := newHarness(t, Options{})
		h.register(src, "run1", nil, []int{upPort}, []string{"127.0.0.1"})
		if err := tlsThroughProxy(t, h, fmt.Sprintf("127.0.0.1:%d", upPort), &tls.Config{InsecureSkipVerify: true}); err != nil {
			t.Fatalf("handshake to an allowed IP literal: %v", err)
		}
		if err := tlsThroughProxy(t, h, fmt.Sprintf("127.0.0.1:%d", upPort), &tls.Config{ServerName: "allowed.test", RootCAs: roots}); err == nil {
			t.Fatal("an SNI naming a host is not the IP literal that was vetted")
		}
	})
}

func TestNonTLSOn443(t *testing.T) {
	upstream := newCountingListener(t, false)
	h := newHarness(t, Options{})
	h.mapDial("127.0.0.1:443", upstream.addr())
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	tun, resp := h.connect(src, "allowed.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	io.WriteString(tun, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if n, err := tun.Read(make([]byte, 1)); err == nil {
		t.Fatalf("tunnel still open after plain text on 443 (read %d bytes)", n)
	}
	if got := h.srv.Denials("run1"); !slices.Equal(got, []Denial{{Host: "allowed.test", Port: 443, Reason: ReasonSNI}}) {
		t.Errorf("Denials = %v", got)
	}
	h.waitLogs(1)
	if n := upstream.bytes.Load(); n != 0 {
		t.Errorf("upstream received %d bytes of the refused stream", n)
	}
}

// A CONNECT tunnel on a plain-HTTP port carried any Host: CONNECT to an
// allowed name, then GET with Host: denied.test reached the server behind
// it (issue 14.4). Now every tunnel must start with a ClientHello naming
// the CONNECT host, on every port; nothing else reaches upstream, and the
// absolute-URI form still serves plain HTTP with the Host the proxy sets.
func TestConnectRefusesNonTLS(t *testing.T) {
	upstream := newCountingListener(t, true)
	upPort := port(t, upstream.addr())
	for _, tc := range []struct{ name, first string }{
		{"HTTP with a smuggled Host", "GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"},
		{"HTTP after blank lines", "\r\n\r\nGET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"},
		{"SSH banner", "SSH-2.0-OpenSSH_9.6\r\n"},
		{"one byte", "G"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
			tun, resp := h.connect(src, "allowed.test:"+strconv.Itoa(upPort))
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			io.WriteString(tun, tc.first)
			if n, err := tun.Read(make([]byte, 64)); err == nil {
				t.Fatalf("tunnel still open after %q (read %d bytes)", tc.first, n)
			}
			if got := h.srv.Denials("run1"); !slices.Equal(got, []Denial{{Host: "allowed.test", Port: upPort, Reason: ReasonSNI}}) {
				t.Errorf("Denials = %v", got)
			}
			h.waitLogs(1)
			if n := upstream.bytes.Load(); n != 0 {
				t.Errorf("upstream received %d bytes of a refused tunnel", n)
			}
		})
	}
}

// denialCase is one refused destination, tried with both request forms.
type denialCase struct {
	name    string
	host    string // as the client writes it
	port    int
	domains []string
	ports   []int
	cidrs   []string
	hosts   map[string][]netip.Addr
	private []netip.Prefix // nil: 127.0.0.0/8 exempted, as in other tests
	want    Denial
}

func TestDenials(t *testing.T) {
	noExempt := []netip.Prefix{}
	hostMap := func(addrs ...string) map[string][]netip.Addr {
		var as []netip.Addr
		for _, a := range addrs {
			as = append(as, netip.MustParseAddr(a))
		}
		return map[string][]netip.Addr{"allowed.test": as}
	}
	tests := []denialCase{
		{name: "name not in list", host: "evil.test", port: 80, domains: []string{"allowed.test"},
			want: Denial{Host: "evil.test", Port: 80, Reason: ReasonNotAllowed}},
		{name: "apex of wildcard", host: "allowed.test", port: 80, domains: []string{"*.allowed.test"},
			want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonNotAllowed}},
		{name: "case and trailing dot normalized", host: "EVIL.test.", port: 80, domains: []string{"allowed.test"},
			want: Denial{Host: "evil.test", Port: 80, Reason: ReasonNotAllowed}},
		{name: "wrong port", host: "allowed.test", port: 8080, domains: []string{"allowed.test"},
			want: Denial{Host: "allowed.test", Port: 8080, Reason: ReasonPort}},
		{name: "IP literal", host: "127.0.0.1", port: 80, domains: []string{"allowed.test"},
			want: Denial{Host: "127.0.0.1", Port: 80, Reason: ReasonIPLiteral}},
		{name: "IPv6 literal", host: "::1", port: 80, domains: []string{"allowed.test"}, cidrs: []string{"127.0.0.0/8"},
			want: Denial{Host: "::1", Port: 80, Reason: ReasonIPLiteral}},
		{name: "IP literal outside CIDR", host: "127.0.0.2", port: 80, cidrs: []string{"127.0.0.1/32"},
			want: Denial{Host: "127.0.0.2", Port: 80, Reason: ReasonIPLiteral}},
		{name: "IP literal in CIDR but private", host: "127.0.0.1", port: 80, cidrs: []string{"127.0.0.0/8"}, private: noExempt,
			want: Denial{Host: "127.0.0.1", Port: 80, Reason: ReasonPrivate}},
		{name: "IP literal in CIDR, wrong port", host: "127.0.0.1", port: 81, cidrs: []string{"127.0.0.0/8"},
			want: Denial{Host: "127.0.0.1", Port: 81, Reason: ReasonPort}},
		{name: "host map to loopback without exemption", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("127.0.0.1"), private: noExempt, want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "host map to RFC 1918", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("10.1.2.3"), private: noExempt, want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "host map to link-local", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("169.254.77.77"), private: noExempt, want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "one bad address among good ones", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("127.0.0.1", "10.1.2.3"), want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "mapped address in host map", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("::ffff:127.0.0.1"), want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "metadata even when exempted", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("100.100.100.200"), private: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")},
			want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonPrivate}},
		{name: "empty host map entry", host: "allowed.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap(), want: Denial{Host: "allowed.test", Port: 80, Reason: ReasonResolve}},
		{name: "name check before resolution", host: "nothere.test", port: 80, domains: []string{"allowed.test"},
			hosts: hostMap("10.1.2.3"), want: Denial{Host: "nothere.test", Port: 80, Reason: ReasonNotAllowed}},
	}
	for _, tt := range tests {
		for _, form := range []string{"CONNECT", "GET"} {
			t.Run(tt.name+"/"+form, func(t *testing.T) { testDenial(t, tt, form) })
		}
	}
}

func testDenial(t *testing.T, tt denialCase, form string) {
	ports := tt.ports
	if ports == nil {
		ports = []int{80, 443, 81}
		if tt.want.Reason == ReasonPort {
			ports = []int{80}
		}
	}
	h := newHarness(t, Options{Hosts: tt.hosts, AllowedPrivate: tt.private})
	h.register(src, "run1", tt.domains, ports, tt.cidrs)
	hostport := net.JoinHostPort(tt.host, strconv.Itoa(tt.port))
	var resp *http.Response
	var body string
	if form == "CONNECT" {
		var tun net.Conn
		tun, resp = h.connect(src, hostport)
		b, _ := io.ReadAll(tun)
		body = string(b)
		tun.Close()
	} else {
		resp, body = h.raw(src, "GET http://"+hostport+"/ HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("status %q, want 403", resp.Status)
	}
	if !strings.Contains(resp.Status, tt.want.Reason) {
		t.Errorf("status text %q does not carry the reason %q", resp.Status, tt.want.Reason)
	}
	if !strings.Contains(body, tt.want.Reason) {
		t.Errorf("body %q does not carry the reason %q", body, tt.want.Reason)
	}
	if got := h.srv.Denials("run1"); !slices.Equal(got, []Denial{tt.want}) {
		t.Errorf("Denials = %v, want [%v]", got, tt.want)
	}
	// A refused destination is never dialed, so e.g. 10.1.2.3 and
	// 169.254.77.77 receive nothing, not even a SYN.
	if d := h.dials(); len(d) != 0 {
		t.Errorf("the proxy dialed %q for a refused destination", d)
	}
	recs := h.waitLogs(1)
	if recs[0]["decision"] != "deny" || recs[0]["reason"] != tt.want.Reason || recs[0]["run"] != "run1" {
		t.Errorf("log record %v", recs[0])
	}
}

func TestIPLiteralAllowedByCIDR(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	h := newHarness(t, Options{})
	h.register(src, "run1", nil, []int{port(t, up.URL)}, []string{"127.0.0.0/8"})
	resp, body := h.raw(src, fmt.Sprintf("GET %s/lit HTTP/1.1\r\n\r\n", up.URL))
	if resp.StatusCode != 200 || body != `GET /lit body=""` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
}

// fakeResolver answers from a table and counts lookups.
type fakeResolver struct {
	answers map[string][]netip.Addr
	calls   atomic.Int32
	block   bool
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.calls.Add(1)
	if network != "ip" {
		return nil, fmt.Errorf("unexpected network %q", network)
	}
	if r.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if a, ok := r.answers[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestResolver(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)

	t.Run("IPv4-mapped answers are unmapped", func(t *testing.T) {
		// Go's resolver returns A records as ::ffff:a.b.c.d; they must be
		// treated as the IPv4 address they are.
		r := &fakeResolver{answers: map[string][]netip.Addr{"dns.test": {netip.MustParseAddr("::ffff:127.0.0.1")}}}
		h := newHarness(t, Options{Resolver: r, Hosts: map[string][]netip.Addr{}})
		h.register(src, "run1", []string{"dns.test"}, []int{upPort}, nil)
		resp, _ := h.raw(src, fmt.Sprintf("GET http://dns.test:%d/ HTTP/1.1\r\n\r\n", upPort))
		if resp.StatusCode != 200 {
			t.Fatalf("status %s", resp.Status)
		}
		if d := h.dials(); !slices.Equal(d, []string{fmt.Sprintf("127.0.0.1:%d", upPort)}) {
			t.Errorf("dials %q", d)
		}
	})
	t.Run("host map takes precedence", func(t *testing.T) {
		r := &fakeResolver{answers: map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("10.9.9.9")}}}
		h := newHarness(t, Options{Resolver: r})
		h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
		resp, _ := h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort))
		if resp.StatusCode != 200 || r.calls.Load() != 0 {
			t.Errorf("status %s, resolver calls %d; want 200 from the host map and no lookup", resp.Status, r.calls.Load())
		}
	})
	t.Run("lookup failure", func(t *testing.T) {
		h := newHarness(t, Options{Resolver: &fakeResolver{}})
		h.register(src, "run1", []string{"missing.test"}, nil, nil)
		resp, _ := h.raw(src, "GET http://missing.test/ HTTP/1.1\r\n\r\n")
		if resp.StatusCode != 403 || !slices.Equal(h.srv.Denials("run1"), []Denial{{Host: "missing.test", Port: 80, Reason: ReasonResolve}}) {
			t.Errorf("status %s, denials %v", resp.Status, h.srv.Denials("run1"))
		}
	})
	t.Run("net.Resolver", func(t *testing.T) {
		// A real *net.Resolver satisfies Resolver. Its DNS transport is
		// hooked so the lookup can never leave the machine.
		var dnsDials atomic.Int32
		nr := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			dnsDials.Add(1)
			return nil, errors.New("no DNS in tests")
		}}
		h := newHarness(t, Options{Resolver: nr, Hosts: map[string][]netip.Addr{}})
		h.register(src, "run1", []string{"nohost.allowed.test"}, nil, nil)
		resp, _ := h.raw(src, "CONNECT nohost.allowed.test:443 HTTP/1.1\r\n\r\n")
		if resp.StatusCode != 403 || !strings.Contains(resp.Status, ReasonResolve) {
			t.Errorf("status %s", resp.Status)
		}
	})
	t.Run("rebinding", func(t *testing.T) {
		// Whatever the resolver says later, the proxy looks the name up
		// once per connection and dials the address it vetted.
		r := &rebindingResolver{first: netip.MustParseAddr("127.0.0.1"), then: netip.MustParseAddr("10.1.2.3")}
		h := newHarness(t, Options{Resolver: r, Hosts: map[string][]netip.Addr{}})
		h.register(src, "run1", []string{"rebind.test"}, []int{upPort}, nil)
		resp, _ := h.raw(src, fmt.Sprintf("GET http://rebind.test:%d/ HTTP/1.1\r\n\r\n", upPort))
		if resp.StatusCode != 200 || r.calls.Load() != 1 {
			t.Fatalf("status %s after %d lookups", resp.Status, r.calls.Load())
		}
		resp, _ = h.raw(src, fmt.Sprintf("GET http://rebind.test:%d/ HTTP/1.1\r\n\r\n", upPort))
		if resp.StatusCode != 403 {
			t.Errorf("second connection (now resolving to 10.1.2.3): %s", resp.Status)
		}
		if d := h.dials(); !slices.Equal(d, []string{fmt.Sprintf("127.0.0.1:%d", upPort)}) {
			t.Errorf("dials %q", d)
		}
	})
}

type rebindingResolver struct {
	first, then netip.Addr
	calls       atomic.Int32
}

func (r *rebindingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if r.calls.Add(1) == 1 {
		return []netip.Addr{r.first}, nil
	}
	return []netip.Addr{r.then}, nil
}

func TestSources(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)
	h := newHarness(t, Options{})
	get := fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort)

	t.Run("unregistered", func(t *testing.T) {
		escapes := metrics.Escapes.Count(metrics.EscapeUnregisteredSource)
		resp, body := h.raw("127.0.0.9", get)
		if resp.StatusCode != 403 || !strings.Contains(body, "not registered") {
			t.Errorf("got %s %q", resp.Status, body)
		}
		if len(h.dials()) != 0 {
			t.Error("dialed for an unregistered source")
		}
		recs := h.waitLogs(1)
		if recs[0]["reason"] != "unregistered source" || recs[0]["src"] != "127.0.0.9" {
			t.Errorf("log %v", recs[0])
		}
		if got := metrics.Escapes.Count(metrics.EscapeUnregisteredSource) - escapes; got != 1 {
			t.Errorf("escape attempts (unregistered_source) moved by %d, want 1", got)
		}
	})
	t.Run("per-run policies", func(t *testing.T) {
		defer h.register("127.0.0.2", "run-a", []string{"allowed.test"}, []int{upPort}, nil)()
		defer h.register("127.0.0.3", "run-b", []string{"other.test"}, []int{upPort}, nil)()
		if resp, _ := h.raw("127.0.0.2", get); resp.StatusCode != 200 {
			t.Errorf("run-a: %s", resp.Status)
		}
		if resp, _ := h.raw("127.0.0.3", get); resp.StatusCode != 403 {
			t.Errorf("run-b: %s", resp.Status)
		}
		if d := h.srv.Denials("run-a"); len(d) != 0 {
			t.Errorf("run-a denials %v", d)
		}
		if d := h.srv.Denials("run-b"); !slices.Equal(d, []Denial{{Host: "allowed.test", Port: upPort, Reason: ReasonNotAllowed}}) {
			t.Errorf("run-b denials %v", d)
		}
	})
	t.Run("unregister", func(t *testing.T) {
		echo := newTLSEcho(t)
		unreg := h.register("127.0.0.4", "run-c", []string{"allowed.test"}, []int{upPort, port(t, echo)}, nil)
		tun := h.tlsTunnel(t, "127.0.0.4", echo)
		io.WriteString(tun, "x")
		if _, err := io.ReadFull(tun, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		h.raw("127.0.0.4", "GET http://evil.test/ HTTP/1.1\r\n\r\n")
		if len(h.srv.Denials("run-c")) != 1 {
			t.Fatalf("denials %v", h.srv.Denials("run-c"))
		}
		unreg()
		unreg() // idempotent
		// The open tunnel of the gone sandbox is closed...
		if _, err := tun.Read(make([]byte, 1)); err == nil {
			t.Error("tunnel survived unregister")
		}
		// ...new connections are refused, and the run is forgotten.
		if resp, _ := h.raw("127.0.0.4", get); resp.StatusCode != 403 {
			t.Errorf("after unregister: %s", resp.Status)
		}
		if d := h.srv.Denials("run-c"); d != nil {
			t.Errorf("denials kept after unregister: %v", d)
		}
	})
	t.Run("re-register", func(t *testing.T) {
		unregOld := h.register("127.0.0.5", "old", []string{"allowed.test"}, []int{upPort}, nil)
		unregNew := h.register("127.0.0.5", "new", []string{"allowed.test"}, []int{upPort}, nil)
		defer unregNew()
		unregOld() // must not remove the newer registration
		if resp, _ := h.raw("127.0.0.5", get); resp.StatusCode != 200 {
			t.Errorf("after the old run's unregister: %s", resp.Status)
		}
	})
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, Options{})
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	tests := []struct {
		name, req, want string
	}{
		{"origin form", "GET /path HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "absolute URI"},
		{"https absolute", "GET https://allowed.test/ HTTP/1.1\r\n\r\n", "through CONNECT"},
		{"other scheme", "GET ftp://allowed.test/ HTTP/1.1\r\n\r\n", "not supported"},
		{"connect without port", "CONNECT allowed.test HTTP/1.1\r\n\r\n", "host:port"},
		{"connect with path", "CONNECT /x HTTP/1.1\r\n\r\n", "host:port"},
		{"connect bad port", "CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n", "bad host or port"},
		{"asterisk", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", "absolute URI"},
		{"garbage", "\x16\x03\x01\x00\x05hello\r\n\r\n", "malformed"},
		{"http2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "egress proxy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := h.raw(src, tt.req)
			if resp.StatusCode != 400 || !strings.Contains(body, tt.want) {
				t.Errorf("got %s %q, want 400 mentioning %q", resp.Status, body, tt.want)
			}
		})
	}
	if len(h.dials()) != 0 || len(h.srv.Denials("run1")) != 0 {
		t.Errorf("bad requests caused dials %v or denials %v", h.dials(), h.srv.Denials("run1"))
	}
}

func TestClose(t *testing.T) {
	echo := newCountingListener(t, true)
	srv, err := New(Options{
		Hosts:          map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1")}},
		AllowedPrivate: []netip.Prefix{loopback},
		Logger:         discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	p, _ := ParsePolicy([]string{"allowed.test"}, []int{port(t, echo.addr())}, nil)
	srv.Register(netip.MustParseAddr(src), "run1", p)

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT allowed.test:%d HTTP/1.1\r\n\r\n", port(t, echo.addr()))
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Error("tunnel open after Close")
	}
	select {
	case err := <-served:
		if !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	if _, err := srv.Listen("127.0.0.1:0"); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Listen after Close: %v", err)
	}
}

func TestLogOncePerConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)
	h := newHarness(t, Options{})
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
	h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort))
	h.raw(src, "GET http://evil.test/ HTTP/1.1\r\n\r\n")
	h.waitLogs(2)
	time.Sleep(50 * time.Millisecond) // a second record per connection would show up here
	recs := h.logRecords("egress connection")
	if len(recs) != 2 {
		t.Fatalf("%d records for 2 connections", len(recs))
	}
	byHost := map[string]map[string]any{}
	for _, r := range recs {
		byHost[r["host"].(string)] = r
	}
	ok := byHost["allowed.test"]
	if ok == nil || ok["run"] != "run1" || ok["port"].(float64) != float64(upPort) || ok["decision"] != "allow" ||
		ok["bytes_up"].(float64) == 0 || ok["bytes_down"].(float64) == 0 || ok["method"] != "GET" {
		t.Errorf("allowed record %v", ok)
	}
	bad := byHost["evil.test"]
	if bad == nil || bad["decision"] != "deny" || bad["reason"] != ReasonNotAllowed || bad["port"].(float64) != 80 || bad["bytes_up"].(float64) != 0 {
		t.Errorf("denied record %v", bad)
	}
}

// A connection from a registered source closed before a byte was sent (a
// networked pod's driver making sure it can reach the proxy) is no
// request: no log record above debug, no metric, no refusal. (An
// unregistered source is answered and counted at once, before anything
// is read: TestSources.)
func TestEmptyConnection(t *testing.T) {
	h := newHarness(t, Options{})
	defer h.register(src, "run1", []string{"allowed.test"}, nil, nil)()
	before := testutil.ToFloat64(metrics.EgressRequests.WithLabelValues(decisionReject)) +
		testutil.ToFloat64(metrics.EgressRequests.WithLabelValues(decisionDeny))
	for i := range 2 {
		_ = h.dialFrom(src).Close()
		deadline := time.Now().Add(5 * time.Second)
		for len(h.logRecords("egress connection closed without a request")) <= i {
			if time.Now().After(deadline) {
				t.Fatalf("no debug record for empty connection %d:\n%s", i, h.logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if recs := h.logRecords("egress connection"); len(recs) != 0 {
		t.Errorf("empty connections logged as requests: %v", recs)
	}
	after := testutil.ToFloat64(metrics.EgressRequests.WithLabelValues(decisionReject)) +
		testutil.ToFloat64(metrics.EgressRequests.WithLabelValues(decisionDeny))
	if after != before {
		t.Errorf("empty connections counted: refused or rejected requests %v -> %v", before, after)
	}
	if d := h.srv.Denials("run1"); len(d) != 0 {
		t.Errorf("denials %v", d)
	}
}
