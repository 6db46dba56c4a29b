package egress

// Requests a hostile sandbox writes byte by byte into an intercepted
// connection: each case was once a way past the proxy (a review of the
// interception code found them), and must stay closed.

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hostileRig is an intercepting proxy whose upstream echoes what it got
// (in X-Seen-* headers and the body), a run with a secret for
// allowed.test and tripwires, and read-only rules for rules.test.
type hostileRig struct {
	*interceptRig
	creds *Credentials
	value string
}

func newHostileRig(t *testing.T, value string, upstream http.HandlerFunc) *hostileRig {
	t.Helper()
	r := newInterceptRig(t)
	if upstream != nil {
		up := httptest.NewUnstartedServer(upstream)
		up.TLS = &tls.Config{Certificates: []tls.Certificate{getCert(t).tls}}
		up.StartTLS()
		t.Cleanup(up.Close)
		r.port = port(t, up.URL)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "v"), []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets, err := LoadSecrets([]SecretSpec{{Name: "API_TOKEN", FromFile: filepath.Join(dir, "v"), Hosts: []string{"allowed.test"}, Header: "Authorization", Format: "Bearer {}"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := secrets.Bind([]string{"API_TOKEN"})
	if err != nil {
		t.Fatal(err)
	}
	creds.AddTripwires()
	r.register(t, "127.0.0.2", "run1", []AllowRule{{Domain: "sub.allowed.test", Methods: []string{"GET"}, Paths: []string{"/public/"}}}, creds)
	return &hostileRig{interceptRig: r, creds: creds, value: value}
}

// raw CONNECTs to host, shakes hands as HTTP/1.1 and writes req (HOST in
// it becomes host:port); it returns everything the proxy answered.
func (r *hostileRig) raw(t *testing.T, host, req string) string {
	t.Helper()
	conn := r.h.dialFrom("127.0.0.2")
	defer conn.Close()
	fmt.Fprintf(conn, "CONNECT %s:%d HTTP/1.1\r\nHost: %[1]s\r\n\r\n", host, r.port)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		return fmt.Sprint("CONNECT refused: ", resp, err)
	}
	tc := tls.Client(&bufferedConn{Conn: conn, r: br}, &tls.Config{ServerName: host, RootCAs: r.trust, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return "handshake: " + err.Error()
	}
	_, _ = io.WriteString(tc, strings.ReplaceAll(req, "HOST", host+":"+strconv.Itoa(r.port)))
	b, _ := io.ReadAll(tc)
	return string(b)
}

func (r *hostileRig) tripwireKey() string { return r.creds.Env["AWS_SECRET_ACCESS_KEY"] }

func TestHostileBodyCannotCrashOrHideATripwire(t *testing.T) {
	r := newHostileRig(t, "a-secret-value-123", nil)
	body := strings.Repeat("\xff", 40) + strings.ToLower(r.tripwireKey())
	for _, h2 := range []bool{false, true} {
		resp, _ := do(t, r.client("127.0.0.2", h2), "POST", r.url("allowed.test", "/x"), body, nil)
		if resp != nil && resp.StatusCode == 200 {
			t.Errorf("h2=%v: the body with a tripwire after invalid UTF-8 was forwarded", h2)
		}
	}
	if strings.Contains(strings.ToLower(r.seenAll()), strings.ToLower(r.tripwireKey())) {
		t.Error("the tripwire reached the upstream")
	}
	if len(r.tripped()) == 0 {
		t.Error("no trip was reported")
	}
}

func TestHostileReportsNeverQuoteTheSecret(t *testing.T) {
	r := newHostileRig(t, "REALSECRETVALUE99", nil)
	ph := r.creds.Env["API_TOKEN"]
	// The path carries the placeholder (substituted before the body is
	// read), the body a tripwire found while it streams.
	_, _ = do(t, r.client("127.0.0.2", false), "POST", r.url("allowed.test", "/x/"+ph), strings.Repeat("a", 70000)+r.tripwireKey(), nil)
	for _, d := range append(r.h.srv.Denials("run1"), r.tripped()...) {
		if strings.Contains(d.Path, r.value) {
			t.Errorf("a denial quotes the secret: %+v", d)
		}
	}
	if strings.Contains(r.h.logs.String(), r.value) {
		t.Error("the log quotes the secret")
	}
}

func TestHostileEscapedEchoIsRedacted(t *testing.T) {
	const value = "real/token+value=1"
	r := newHostileRig(t, value, nil)
	ph := r.creds.Env["API_TOKEN"]
	resp, body := do(t, r.client("127.0.0.2", true), "GET", r.url("allowed.test", "/x?k="+ph), "", nil)
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("%v %q", resp, body)
	}
	seen := r.lastSeen()
	if !strings.Contains(seen, "k=real%2Ftoken%2Bvalue%3D1") {
		t.Fatalf("the upstream did not get the value: %s", seen)
	}
	all := fmt.Sprint(resp.Header) + body
	for _, form := range []string{value, "real%2Ftoken%2Bvalue%3D1", "real%2ftoken%2bvalue%3d1", "real%2Ftoken+value=1"} {
		if strings.Contains(all, form) {
			t.Errorf("the response reached the sandbox with %q in it: %s", form, all)
		}
	}
}

func TestHostileUpgrades(t *testing.T) {
	const value = "REALSECRETVALUE99"
	r := newHostileRig(t, value, func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Upgrade") == "" {
			fmt.Fprint(w, "plain")
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\nX-Echo: %s\r\n\r\nstream says %[2]s\n", req.Header.Get("Upgrade"), req.Header.Get("Authorization"))
		_ = brw.Flush()
	})
	// A WebSocket opening to the secret's host: headers and stream come
	// back with the placeholder where the upstream echoed the value.
	out := r.raw(t, "allowed.test", "GET /ws HTTP/1.1\r\nHost: HOST\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if !strings.Contains(out, "101 Switching Protocols") || strings.Contains(out, value) || !strings.Contains(out, "stream says Bearer "+r.creds.Env["API_TOKEN"]) {
		t.Errorf("WebSocket echo: %q", out)
	}
	// Any other upgrade, or one that is not a GET, is refused: the
	// tunnel behind it would carry requests no rule sees.
	for _, req := range []string{
		"GET /ws HTTP/1.1\r\nHost: HOST\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
		"GET /public/x HTTP/1.1\r\nHost: HOST\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n",
		"POST /ws HTTP/1.1\r\nHost: HOST\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n",
	} {
		host := "allowed.test"
		if strings.Contains(req, "/public/") {
			host = "sub.allowed.test"
		}
		if out := r.raw(t, host, req); !strings.HasPrefix(out, "HTTP/1.1 403") || !strings.Contains(out, "only WebSocket upgrades") {
			t.Errorf("%q: %.80q", req, out)
		}
	}
}

func TestHostilePathsAndMethods(t *testing.T) {
	r := newHostileRig(t, "a-secret-value-123", nil)
	for _, p := range []string{"/public/..;/admin", "/public/..%5cadmin", "/public/..\\admin", "/public/%2e%2e/admin", "/public%2f..%2fadmin", "/public/x%3b/../../admin"} {
		out := r.raw(t, "sub.allowed.test", "GET "+p+" HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 403") {
			t.Errorf("GET %s: %.60q, want 403", p, out)
		}
	}
	before := len(r.seenList())
	out := r.raw(t, "sub.allowed.test", "GET /public/x HTTP/1.1\r\nHost: HOST\r\nX-HTTP-Method-Override: DELETE\r\nX-Method-Override: DELETE\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(out, "HTTP/1.1 200") || len(r.seenList()) != before+1 || strings.Contains(r.lastSeen(), "DELETE") {
		t.Errorf("method override: %.40q, upstream saw %s", out, r.lastSeen())
	}
}

func TestHostileTripwireHidingPlaces(t *testing.T) {
	r := newHostileRig(t, "a-secret-value-123", nil)
	key := r.tripwireKey()
	esc := "%" + strconv.FormatInt(int64(key[0]), 16) + key[1:]
	for name, req := range map[string]string{
		"method":                   key + " /x HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n",
		"query after a bad escape": "GET /x?bad=%zz&k=" + esc + " HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n\r\n",
		"escaped header value":     "GET /x HTTP/1.1\r\nHost: HOST\r\nX-K: " + esc + "\r\nConnection: close\r\n\r\n",
	} {
		before := len(r.tripped())
		out := r.raw(t, "allowed.test", req)
		if len(r.tripped()) != before+1 || strings.HasPrefix(out, "HTTP/1.1 200") {
			t.Errorf("%s: not tripped (%.40q)", name, out)
		}
	}
	if strings.Contains(strings.ToLower(r.seenAll()), strings.ToLower(key[1:])) {
		t.Error("a tripwire reached the upstream")
	}
}

func TestHostileResponsesWithSecretsStaySearchable(t *testing.T) {
	const value = "REALSECRETVALUE99"
	r := newHostileRig(t, value, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("X-Range", req.Header.Get("Range"))
		if req.URL.Path == "/encoded" {
			w.Header().Add("Content-Encoding", "identity")
			w.Header().Add("Content-Encoding", "gzip")
		}
		w.Header().Set("Trailer", "X-Tail")
		fmt.Fprint(w, "body")
		w.Header().Set("X-Tail", req.Header.Get("Authorization"))
	})
	c := r.client("127.0.0.2", false)
	if resp, body := do(t, c, "GET", r.url("allowed.test", "/encoded"), "", nil); resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a compressed answer under a second Content-Encoding line: %v %q", resp, body)
	}
	resp, _ := do(t, c, "GET", r.url("allowed.test", "/plain"), "", map[string]string{"Range": "bytes=0-3"})
	if resp == nil || resp.Header.Get("X-Range") != "" {
		t.Errorf("Range reached the secret's host: %v", resp)
	}
	if resp != nil && strings.Contains(fmt.Sprint(resp.Trailer), value) {
		t.Errorf("a trailer carried the secret: %v", resp.Trailer)
	}
}

func (r *interceptRig) seenList() []string {
	r.tripMu.Lock()
	defer r.tripMu.Unlock()
	return append([]string(nil), r.seen...)
}

func (r *interceptRig) seenAll() string { return strings.Join(r.seenList(), "\n") }
