package egress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestDefaults(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := s.opts
	checks := []struct {
		name      string
		got, want any
	}{
		{"MaxConnsPerRun", o.MaxConnsPerRun, DefaultMaxConnsPerRun},
		{"MaxHeaderBytes", o.MaxHeaderBytes, DefaultMaxHeaderBytes},
		{"MaxResponseHeaderBytes", o.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes},
		{"MaxDenialsPerRun", o.MaxDenialsPerRun, DefaultMaxDenialsPerRun},
		{"HeaderTimeout", o.HeaderTimeout, DefaultHeaderTimeout},
		{"HelloTimeout", o.HelloTimeout, DefaultHelloTimeout},
		{"ResolveTimeout", o.ResolveTimeout, DefaultResolveTimeout},
		{"DialTimeout", o.DialTimeout, DefaultDialTimeout},
		{"IdleTimeout", o.IdleTimeout, DefaultIdleTimeout},
		{"AllowedPrivate", len(o.AllowedPrivate), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if o.Resolver != Resolver(net.DefaultResolver) || o.Dialer == nil || o.Logger == nil {
		t.Error("Resolver, Dialer and Logger must default")
	}
	for _, bad := range []Options{
		{MaxConnsPerRun: -1}, {IdleTimeout: -time.Second},
		{AllowedPrivate: []netip.Prefix{{}}},
		{Hosts: map[string][]netip.Addr{"bad name": {netip.MustParseAddr("127.0.0.1")}}},
		{Hosts: map[string][]netip.Addr{"ok.test": {{}}}},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted invalid options", bad)
		}
	}
}

func TestMaxConnsPerRun(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)
	h := newHarness(t, Options{MaxConnsPerRun: 2})
	// Two source addresses of the same run share its budget.
	h.register("127.0.0.1", "run1", []string{"allowed.test"}, []int{upPort}, nil)
	h.register("127.0.0.2", "run1", []string{"allowed.test"}, []int{upPort}, nil)
	h.register("127.0.0.3", "run2", []string{"allowed.test"}, []int{upPort}, nil)
	get := fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort)

	// Two connections that sit in their request head hold both slots.
	held := []net.Conn{h.dialFrom("127.0.0.1"), h.dialFrom("127.0.0.2")}
	for _, c := range held {
		io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\n")
	}
	waitActive(t, h, "run1", 2)

	resp, body := h.raw("127.0.0.1", get)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "2 open connections") {
		t.Errorf("third connection: %s %q, want 429", resp.Status, body)
	}
	if resp, _ := h.raw("127.0.0.3", get); resp.StatusCode != 200 {
		t.Errorf("another run must not be affected: %s", resp.Status)
	}
	held[0].Close()
	waitActive(t, h, "run1", 1)
	if resp, _ := h.raw("127.0.0.2", get); resp.StatusCode != 200 {
		t.Errorf("after a slot was freed: %s", resp.Status)
	}
	if d := h.srv.Denials("run1"); len(d) != 0 {
		t.Errorf("a busy proxy is not a policy denial: %v", d)
	}
}

func waitActive(t *testing.T, h *harness, run string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.srv.mu.Lock()
		got := 0
		if r := h.srv.runs[run]; r != nil {
			got = r.active
		}
		h.srv.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s has %d active connections, want %d", run, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMaxHeaderBytes(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)
	h := newHarness(t, Options{MaxHeaderBytes: 1024})
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
	reqWith := func(pad int) string {
		return fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\nX-Pad: %s\r\n\r\n", upPort, strings.Repeat("a", pad))
	}
	if resp, _ := h.raw(src, reqWith(900)); resp.StatusCode != 200 {
		t.Errorf("header under the cap: %s", resp.Status)
	}
	resp, body := h.raw(src, reqWith(2000))
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(body, "1024") {
		t.Errorf("header over the cap: %s %q, want 431", resp.Status, body)
	}
	// The cap is on the head only: a body far larger than it passes.
	big := strings.Repeat("b", 64<<10)
	resp, body = h.raw(src, fmt.Sprintf("POST http://allowed.test:%d/ HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s", upPort, len(big), big))
	if resp.StatusCode != 200 || !strings.Contains(body, big) {
		t.Errorf("large body: %s (%d bytes)", resp.Status, len(body))
	}
}

func TestMaxResponseHeaderBytes(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Header().Set("X-Big", strings.Repeat("z", 4096))
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	upPort := port(t, up.URL)
	h := newHarness(t, Options{MaxResponseHeaderBytes: 1024})
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
	if resp, body := h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/small HTTP/1.1\r\n\r\n", upPort)); resp.StatusCode != 200 || body != "ok" {
		t.Errorf("small response: %s %q", resp.Status, body)
	}
	resp, body := h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/big HTTP/1.1\r\n\r\n", upPort))
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "exceeds 1024") {
		t.Errorf("big response header: %s %q, want 502", resp.Status, body)
	}
}

func TestHeaderTimeout(t *testing.T) {
	h := newHarness(t, Options{HeaderTimeout: 150 * time.Millisecond})
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	c := h.dialFrom(src)
	io.WriteString(c, "GET http://allowed.test/ HTTP/1.1\r\n") // never finished
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read succeeded")
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("stalled request head held for %s", el)
	}
}

func TestHelloTimeout(t *testing.T) {
	upstream := newCountingListener(t, false)
	h := newHarness(t, Options{HelloTimeout: 150 * time.Millisecond})
	h.mapDial("127.0.0.1:443", upstream.addr())
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	tun, resp := h.connect(src, "allowed.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	start := time.Now()
	io.WriteString(tun, "\x16\x03\x01") // a hello that never completes
	if _, err := tun.Read(make([]byte, 1)); err == nil {
		t.Fatal("read succeeded")
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("incomplete ClientHello held for %s", el)
	}
	if d := h.srv.Denials("run1"); !slices.Equal(d, []Denial{{Host: "allowed.test", Port: 443, Reason: ReasonSNI}}) {
		t.Errorf("Denials = %v", d)
	}
}

func TestIdleTimeout(t *testing.T) {
	echo := newTLSEcho(t)
	h := newHarness(t, Options{IdleTimeout: 300 * time.Millisecond})
	h.register(src, "run1", []string{"allowed.test"}, []int{port(t, echo)}, nil)
	tun := h.tlsTunnel(t, src, echo)
	// Traffic every 100 ms keeps the tunnel open well past the timeout.
	buf := make([]byte, 1)
	for range 8 {
		io.WriteString(tun, "x")
		if _, err := io.ReadFull(tun, buf); err != nil {
			t.Fatalf("active tunnel closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Silence closes it.
	start := time.Now()
	if _, err := tun.Read(buf); err == nil {
		t.Fatal("idle tunnel still delivering data")
	}
	if el := time.Since(start); el < 150*time.Millisecond || el > 3*time.Second {
		t.Errorf("idle tunnel closed after %s, want about 300ms", el)
	}
	recs := h.waitLogs(1)
	if recs[0]["idle_timeout"] == nil {
		t.Errorf("log record does not say the idle timer closed it: %v", recs[0])
	}
}

func TestDialTimeout(t *testing.T) {
	h := newHarness(t, Options{
		DialTimeout: 150 * time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			<-ctx.Done() // an upstream that never answers
			return nil, ctx.Err()
		},
		Hosts: map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}},
	})
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	start := time.Now()
	_, resp := h.connect(src, "allowed.test:443")
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("status %s, want 504", resp.Status)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("dial timeout took %s", el)
	}
	// The timeout bounds the whole dial, not each address.
	if d := h.dials(); !slices.Equal(d, []string{"127.0.0.1:443"}) {
		t.Errorf("attempts %q", d)
	}
}

func TestDialFailover(t *testing.T) {
	// A refused first address falls back to the next vetted one.
	up := httptest.NewServer(http.HandlerFunc(echoHandler))
	defer up.Close()
	upPort := port(t, up.URL)
	dead, _ := net.Listen("tcp", "127.0.0.3:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	h := newHarness(t, Options{Hosts: map[string][]netip.Addr{"allowed.test": {netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.1")}}})
	h.mapDial(fmt.Sprintf("127.0.0.3:%d", upPort), deadAddr)
	h.register(src, "run1", []string{"allowed.test"}, []int{upPort}, nil)
	if resp, _ := h.raw(src, fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\n\r\n", upPort)); resp.StatusCode != 200 {
		t.Errorf("status %s", resp.Status)
	}
	if len(h.dials()) != 2 {
		t.Errorf("dials %q", h.dials())
	}
}

func TestResolveTimeout(t *testing.T) {
	r := &fakeResolver{block: true}
	h := newHarness(t, Options{ResolveTimeout: 150 * time.Millisecond, Resolver: r, Hosts: map[string][]netip.Addr{}})
	h.register(src, "run1", []string{"slow.test"}, nil, nil)
	start := time.Now()
	resp, _ := h.raw(src, "GET http://slow.test/ HTTP/1.1\r\n\r\n")
	if resp.StatusCode != 403 || !strings.Contains(resp.Status, ReasonResolve) {
		t.Errorf("status %s", resp.Status)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("lookup timeout took %s", el)
	}
}

func TestMaxDenialsPerRun(t *testing.T) {
	h := newHarness(t, Options{MaxDenialsPerRun: 3})
	h.register(src, "run1", []string{"allowed.test"}, nil, nil)
	for _, host := range []string{"a.test", "a.test", "A.test.", "b.test", "c.test", "d.test"} {
		h.raw(src, "GET http://"+host+"/ HTTP/1.1\r\n\r\n")
	}
	want := []Denial{{Host: "a.test", Port: 80, Reason: ReasonNotAllowed}, {Host: "b.test", Port: 80, Reason: ReasonNotAllowed}, {Host: "c.test", Port: 80, Reason: ReasonNotAllowed}}
	if got := h.srv.Denials("run1"); !slices.Equal(got, want) {
		t.Errorf("Denials = %v, want %v (distinct, first seen, capped)", got, want)
	}
}
