package egress

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// interceptRig is a proxy with a CA, an HTTPS echo upstream that speaks
// HTTP/1.1 and HTTP/2, and the pool sandboxes would trust.
type interceptRig struct {
	h      *harness
	ca     *CA
	trust  *x509.CertPool // what a sandbox trusts: the airlock CA only
	port   int            // the upstream's port, for allowed.test and other.test
	plain  int            // a plain HTTP echo's port
	tripMu sync.Mutex
	trips  []Denial
	seen   []string // what the HTTPS upstream received, one per request
}

func (r *interceptRig) lastSeen() string {
	r.tripMu.Lock()
	defer r.tripMu.Unlock()
	if len(r.seen) == 0 {
		return ""
	}
	return r.seen[len(r.seen)-1]
}

func newInterceptRig(t *testing.T) *interceptRig {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &interceptRig{}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		hdr, _ := json.Marshal(req.Header)
		r.tripMu.Lock()
		r.seen = append(r.seen, req.RequestURI+"\n"+string(hdr)+"\n"+string(body))
		r.tripMu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(body))
		w.Header().Set("X-Seen-Proto", req.Proto)
		echoHandler(w, req)
	}))
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{Certificates: []tls.Certificate{getCert(t).tls}}
	up.Config.ErrorLog = log.New(io.Discard, "", 0) // the blind-tunnel case fails a handshake on purpose
	up.StartTLS()
	t.Cleanup(up.Close)
	plain := httptest.NewServer(http.HandlerFunc(echoHandler))
	t.Cleanup(plain.Close)

	r.ca, r.port, r.plain = ca, port(t, up.URL), port(t, plain.URL)
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	r.h = newHarness(t, Options{
		CA: ca, UpstreamRoots: getCert(t).roots,
		Hosts: map[string][]netip.Addr{"allowed.test": lo, "other.test": lo, "sub.allowed.test": lo},
	})
	r.h.srv.OnTripwire(func(_ string, d Denial) {
		r.tripMu.Lock()
		defer r.tripMu.Unlock()
		r.trips = append(r.trips, d)
	})
	r.trust = x509.NewCertPool()
	r.trust.AppendCertsFromPEM(ca.CertPEM())
	return r
}

func (r *interceptRig) tripped() []Denial {
	r.tripMu.Lock()
	defer r.tripMu.Unlock()
	return slices.Clone(r.trips)
}

// client is a sandbox's HTTP client from src; h2 chooses whether it
// offers HTTP/2.
func (r *interceptRig) client(src string, h2 bool) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: r.h.addr}),
		DialContext:       d.DialContext,
		TLSClientConfig:   &tls.Config{RootCAs: r.trust},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Timeout: 20 * time.Second, Transport: tr}
}

func (r *interceptRig) url(host, path string) string {
	return "https://" + host + ":" + strconv.Itoa(r.port) + path
}

// do sends a request and returns the response with its body read.
func do(t *testing.T, c *http.Client, method, u, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (r *interceptRig) register(t *testing.T, src, run string, rules []AllowRule, creds *Credentials) {
	t.Helper()
	p, err := ParsePolicy([]string{"allowed.test", "other.test", "*.allowed.test"}, []int{r.port, r.plain}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithRules(rules); err != nil {
		t.Fatal(err)
	}
	if creds != nil {
		p = p.WithCredentials(creds)
	}
	t.Cleanup(r.h.srv.Register(netip.MustParseAddr(src), run, p))
}

func TestInterceptL7Rules(t *testing.T) {
	r := newInterceptRig(t)
	r.register(t, "127.0.0.2", "run1", []AllowRule{{Domain: "allowed.test", Methods: []string{"get", "HEAD"}, Paths: []string{"/v1/"}}}, nil)
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
		t.Run(proto, func(t *testing.T) {
			c := r.client("127.0.0.2", h2)
			resp, body := do(t, c, "GET", r.url("allowed.test", "/v1/items?q=1"), "", nil)
			if resp == nil || resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /v1/items") {
				t.Fatalf("allowed GET: %v %q", resp, body)
			}
			if resp.Proto != proto {
				t.Errorf("sandbox side spoke %s, want %s", resp.Proto, proto)
			}
			if got := resp.Header.Get("X-Seen-Proto"); got != "HTTP/2.0" {
				t.Errorf("upstream side spoke %s, want HTTP/2.0 (the proxy's own client negotiates it)", got)
			}
			leaf := resp.TLS.PeerCertificates[0]
			if !slices.Equal(leaf.DNSNames, []string{"allowed.test"}) || leaf.Issuer.CommonName != "airlock egress interception CA" || leaf.NotAfter.After(time.Now().Add(leafLifetime)) {
				t.Errorf("leaf: names %v issuer %q expires %v", leaf.DNSNames, leaf.Issuer.CommonName, leaf.NotAfter)
			}
			for _, tc := range []struct{ method, path, want string }{
				{"POST", "/v1/items", "POST /v1/items on allowed.test is outside network.allow rule {allowed.test methods GET,HEAD paths /v1/}"},
				{"GET", "/v2/items", "GET /v2/items on allowed.test is outside"},
				{"GET", "/v10/items", "GET /v10/items on allowed.test is outside"},
				{"GET", "/v1/../admin", "not a canonical path"},
			} {
				resp, body := do(t, c, tc.method, r.url("allowed.test", tc.path), "x", nil)
				if resp == nil || resp.StatusCode != 403 || !strings.Contains(body, tc.want) {
					t.Errorf("%s %s: %v %q, want 403 with %q", tc.method, tc.path, resp, body, tc.want)
				}
			}
		})
	}
	ds := r.h.srv.Denials("run1")
	if !slices.Contains(ds, Denial{Host: "allowed.test", Port: r.port, Reason: ReasonRule, Method: "POST", Path: "/v1/items"}) {
		t.Errorf("denials %+v lack the POST with its method and path", ds)
	}
	// A host without a rule is not intercepted: the sandbox sees the
	// upstream's own certificate, which the airlock CA did not sign.
	if _, err := do(t, r.client("127.0.0.2", true), "GET", r.url("other.test", "/"), "", nil); !strings.Contains(err, "certificate") {
		t.Errorf("other.test through the airlock CA: %q, want a certificate error (a blind tunnel)", err)
	}
}

func TestInterceptPlainHTTPRules(t *testing.T) {
	r := newInterceptRig(t)
	r.register(t, "127.0.0.2", "run1", []AllowRule{{Domain: "allowed.test", Methods: []string{"GET"}}}, nil)
	c := r.h.client("127.0.0.2", nil)
	base := "http://allowed.test:" + strconv.Itoa(r.plain)
	if resp, body := do(t, c, "GET", base+"/a", "", nil); resp == nil || resp.StatusCode != 200 {
		t.Errorf("GET: %v %q", resp, body)
	}
	resp, body := do(t, c, "DELETE", base+"/a", "", nil)
	if resp == nil || resp.StatusCode != 403 || !strings.Contains(body, "DELETE /a on allowed.test is outside network.allow rule") {
		t.Errorf("DELETE: %v %q", resp, body)
	}
	// Nothing was dialed for the refused request.
	if n := len(r.h.dials()); n != 1 {
		t.Errorf("%d dials, want 1", n)
	}
}

func TestInterceptRefusesAnotherHostInside(t *testing.T) {
	r := newInterceptRig(t)
	r.register(t, "127.0.0.2", "run1", []AllowRule{{Domain: "allowed.test", Methods: []string{"GET"}}}, nil)
	c := r.client("127.0.0.2", false)
	// The request names another allowed site at the same address.
	req, _ := http.NewRequest("GET", r.url("allowed.test", "/"), nil)
	req.Host = "other.test:" + strconv.Itoa(r.port)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || r.lastSeen() != "" {
		t.Errorf("request for other.test inside allowed.test's connection: %d; upstream saw %q", resp.StatusCode, r.lastSeen())
	}
}

func TestSecrets(t *testing.T) {
	r := newInterceptRig(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tok"), []byte("real-token-value-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets, err := LoadSecrets([]SecretSpec{
		{Name: "API_TOKEN", FromFile: filepath.Join(dir, "tok"), Hosts: []string{"allowed.test"}, Header: "Authorization", Format: "Bearer {}"},
		{Name: "BODY_KEY", FromEnv: "X", Hosts: []string{"allowed.test"}, InBody: true},
	}, func(string) string { return "body-secret-value-456" })
	if err != nil {
		t.Fatal(err)
	}
	creds, err := secrets.Bind([]string{"API_TOKEN", "BODY_KEY"})
	if err != nil {
		t.Fatal(err)
	}
	ph, bph := creds.Env["API_TOKEN"], creds.Env["BODY_KEY"]
	if !strings.HasPrefix(ph, placeholderPrefix) || strings.Contains(ph, "real-token") {
		t.Fatalf("placeholder %q", ph)
	}
	again, _ := secrets.Bind([]string{"API_TOKEN"})
	if again.Env["API_TOKEN"] == ph {
		t.Error("two binds gave the same placeholder")
	}
	r.register(t, "127.0.0.2", "run1", nil, creds)
	c := r.client("127.0.0.2", true)

	t.Run("substituted on its host, redacted on the way back", func(t *testing.T) {
		resp, body := do(t, c, "POST", r.url("allowed.test", "/echo?key="+ph), "k="+bph+"&t="+ph, map[string]string{"X-Key": "token " + ph})
		if resp == nil || resp.StatusCode != 200 {
			t.Fatalf("%v %q", resp, body)
		}
		seen := resp.Header.Get("X-Seen-Headers") + resp.Header.Get("X-Seen-URI") + body
		for _, v := range []string{"real-token-value-123", "body-secret-value-456"} {
			if strings.Contains(seen, v) {
				t.Errorf("the response reached the sandbox with %q in it: %s", v, seen)
			}
		}
		var hdr map[string][]string
		_ = json.Unmarshal([]byte(resp.Header.Get("X-Seen-Headers")), &hdr)
		// The upstream saw the value where the placeholder was, redacted
		// back into the placeholder for the sandbox.
		if got := hdr["Authorization"]; !slices.Equal(got, []string{"Bearer " + ph}) {
			t.Errorf("Authorization as the sandbox sees it: %v", got)
		}
		if got := hdr["X-Key"]; !slices.Equal(got, []string{"token " + ph}) {
			t.Errorf("X-Key as the sandbox sees it: %v", got)
		}
		if !strings.Contains(body, `k=`+bph) || !strings.Contains(body, `t=`+ph) {
			t.Errorf("body %q", body)
		}
	})
	t.Run("the upstream received the values", func(t *testing.T) {
		seen := r.lastSeen()
		for _, want := range []string{"key=real-token-value-123", `"Bearer real-token-value-123"`, `"token real-token-value-123"`, "k=body-secret-value-456"} {
			if !strings.Contains(seen, want) {
				t.Errorf("upstream saw %q, want %q in it", seen, want)
			}
		}
		// in_body is per secret: API_TOKEN's placeholder in the body stays.
		if !strings.Contains(seen, "t="+ph) || strings.Contains(seen, bph) {
			t.Errorf("upstream body substitution: %q", seen)
		}
	})
	t.Run("placeholder to another host", func(t *testing.T) {
		for _, tc := range []struct{ name, u, body string }{
			{"header", r.url("other.test", "/"), ""},
			{"body", r.url("other.test", "/"), "x=" + ph},
			{"subdomain", r.url("sub.allowed.test", "/"), ""},
		} {
			hdr := map[string]string{}
			if tc.body == "" {
				hdr["X-Key"] = ph
			}
			resp, body := do(t, c, "POST", tc.u, tc.body, hdr)
			if resp != nil && resp.StatusCode == 200 {
				t.Errorf("%s: forwarded: %q", tc.name, body)
			}
		}
		ds := r.h.srv.Denials("run1")
		if !slices.ContainsFunc(ds, func(d Denial) bool { return d.Host == "other.test" && d.Reason == ReasonSecretWrongHost }) {
			t.Errorf("denials %+v", ds)
		}
	})
	t.Run("plain HTTP", func(t *testing.T) {
		resp, body := do(t, r.h.client("127.0.0.2", nil), "GET", "http://allowed.test:"+strconv.Itoa(r.plain)+"/?k="+ph, "", nil)
		if resp == nil || resp.StatusCode != 403 || !strings.Contains(body, "only over HTTPS") {
			t.Errorf("%v %q", resp, body)
		}
	})
	t.Run("unknown name", func(t *testing.T) {
		if _, err := secrets.Bind([]string{"NOPE"}); err == nil || !strings.Contains(err.Error(), "configured: API_TOKEN, BODY_KEY") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestTripwires(t *testing.T) {
	r := newInterceptRig(t)
	for i, tc := range []struct {
		name string
		send func(c *http.Client, src, trip string) (*http.Response, string)
	}{
		{"query", func(c *http.Client, src, v string) (*http.Response, string) {
			return do(t, c, "GET", r.url("allowed.test", "/?k="+v), "", nil)
		}},
		{"header", func(c *http.Client, src, v string) (*http.Response, string) {
			return do(t, c, "GET", r.url("allowed.test", "/"), "", map[string]string{"X-Exfil": v})
		}},
		{"body", func(c *http.Client, src, v string) (*http.Response, string) {
			return do(t, c, "POST", r.url("allowed.test", "/"), strings.Repeat("a", 40000)+v, nil)
		}},
		{"host name", func(c *http.Client, src, v string) (*http.Response, string) {
			return do(t, c, "GET", r.url(strings.ToLower(v)+".allowed.test", "/"), "", nil)
		}},
		{"plain HTTP", func(c *http.Client, src, v string) (*http.Response, string) {
			return do(t, r.h.client(src, nil), "GET", "http://allowed.test:"+strconv.Itoa(r.plain)+"/"+v, "", nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, run := fmt.Sprintf("127.0.1.%d", i+2), "trip-"+strconv.Itoa(i)
			creds := &Credentials{Env: map[string]string{}, Files: map[string]string{}}
			creds.AddTripwires()
			r.register(t, src, run, nil, creds)
			before := len(r.tripped())
			c := r.client(src, true)
			// A clean request goes through; reading is not a trip.
			if resp, body := do(t, c, "GET", r.url("allowed.test", "/fine"), "", nil); resp == nil || resp.StatusCode != 200 {
				t.Fatalf("clean request: %v %q", resp, body)
			}
			resp, body := tc.send(c, src, creds.Env["AWS_SECRET_ACCESS_KEY"])
			if resp != nil && resp.StatusCode == 200 {
				t.Errorf("tripwire forwarded: %q", body)
			}
			got := r.tripped()
			if len(got) != before+1 || got[len(got)-1].Reason != ReasonTripwire {
				t.Fatalf("tripwire calls %+v", got)
			}
			if !slices.ContainsFunc(r.h.srv.Denials(run), func(d Denial) bool { return d.Reason == ReasonTripwire }) {
				t.Errorf("denials %+v", r.h.srv.Denials(run))
			}
		})
	}
}

func TestCAFile(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, caKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil || string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Fatalf("second load: %v (same CA: %v)", err, err == nil && string(again.CertPEM()) == string(ca.CertPEM()))
	}
	if strings.Contains(string(ca.CertPEM()), "PRIVATE") {
		t.Error("the certificate PEM carries a key")
	}
	_ = os.Chmod(filepath.Join(dir, caKeyFile), 0o644)
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key: %v", err)
	}
	_ = os.Remove(filepath.Join(dir, caKeyFile))
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "half there") {
		t.Errorf("half a CA: %v", err)
	}
}

func TestScanner(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		needles        []needle
		stopped        bool
	}{
		{"replace across reads", "aaSECRETbbSECRET", "aaXbbX", []needle{{find: []byte("SECRET"), repl: []byte("X")}}, false},
		{"no needle", "plain text", "plain text", []needle{{find: []byte("SECRET"), repl: []byte("X")}}, false},
		{"partial at end", "aaSECRE", "aaSECRE", []needle{{find: []byte("SECRET"), repl: []byte("X")}}, false},
		{"stop withholds the needle", "aaTRIPbb", "aa", []needle{{find: []byte("TRIP"), stop: true}}, true},
		{"fold", "aatripbb", "aa", []needle{{find: []byte("TRIP"), fold: true, stop: true}}, true},
		// bytes.ToLower would make each \xff three bytes and shift every
		// index after it (it once panicked the server, and let a tripwire by).
		{"fold after invalid UTF-8", strings.Repeat("\xff", 40) + "TrIp", strings.Repeat("\xff", 40), []needle{{find: []byte("TRIP"), fold: true, stop: true}}, true},
		{"fold after a shrinking rune", strings.Repeat("\u212a", 20) + "trip", strings.Repeat("\u212a", 20), []needle{{find: []byte("TRIP"), fold: true, stop: true}}, true},
		{"longest of two at one place", "xxABCDxx", "xx2xx", []needle{{find: []byte("ABC"), repl: []byte("1")}, {find: []byte("ABCD"), repl: []byte("2")}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScanner(io.NopCloser(&oneByteReader{s: tc.in}), tc.needles)
			got, err := io.ReadAll(sc)
			if string(got) != tc.want || (err != nil) != tc.stopped {
				t.Errorf("got %q err %v, want %q stopped=%v", got, err, tc.want, tc.stopped)
			}
		})
	}
}

// oneByteReader returns one byte per Read, so needles span reads.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

func TestLoadSecretsRefusals(t *testing.T) {
	env := func(k string) string { return map[string]string{"LONG": "long-enough-value", "SHORT": "abc"}[k] }
	for _, tc := range []struct {
		name string
		spec SecretSpec
		want string
	}{
		{"lower-case name", SecretSpec{Name: "token", FromEnv: "LONG", Hosts: []string{"a.test"}}, "upper case"},
		{"no source", SecretSpec{Name: "T", Hosts: []string{"a.test"}}, "exactly one of from_file or from_env"},
		{"both sources", SecretSpec{Name: "T", FromEnv: "LONG", FromFile: "/x", Hosts: []string{"a.test"}}, "exactly one"},
		{"unset env", SecretSpec{Name: "T", FromEnv: "NOPE", Hosts: []string{"a.test"}}, "empty or unset"},
		{"short", SecretSpec{Name: "T", FromEnv: "SHORT", Hosts: []string{"a.test"}}, "shorter than 8"},
		{"no hosts", SecretSpec{Name: "T", FromEnv: "LONG"}, "hosts is empty"},
		{"bad host", SecretSpec{Name: "T", FromEnv: "LONG", Hosts: []string{"https://a.test"}}, "bare domain"},
		{"format without header", SecretSpec{Name: "T", FromEnv: "LONG", Hosts: []string{"a.test"}, Format: "Bearer {}"}, "without header"},
		{"format without {}", SecretSpec{Name: "T", FromEnv: "LONG", Hosts: []string{"a.test"}, Header: "Authorization", Format: "Bearer"}, "exactly once"},
		{"bad header", SecretSpec{Name: "T", FromEnv: "LONG", Hosts: []string{"a.test"}, Header: "Auth orization"}, "not an HTTP header name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadSecrets([]SecretSpec{tc.spec}, env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "long-enough-value") {
				t.Errorf("the error shows the value: %v", err)
			}
		})
	}
	if _, err := LoadSecrets([]SecretSpec{{Name: "T", FromEnv: "LONG", Hosts: []string{"a.test"}}, {Name: "T", FromEnv: "LONG", Hosts: []string{"a.test"}}}, env); err == nil || !strings.Contains(err.Error(), "used twice") {
		t.Errorf("duplicate: %v", err)
	}
}

func TestFromSettingsSecretsAndCA(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AIRLOCK_TEST_SECRET", "a-value-long-enough")
	base := Settings{Domains: []string{"api.test"}, StateDir: dir}
	st, err := FromSettings(base)
	if err != nil || st.CABundle != nil || st.Proxy.opts.CA != nil {
		t.Fatalf("a plain allow-list made a CA: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, caKeyFile)); err == nil {
		t.Error("CA files written without need")
	}
	withSecret := base
	withSecret.Secrets = []SecretSpec{{Name: "T", FromEnv: "AIRLOCK_TEST_SECRET", Hosts: []string{"other.test"}}}
	if _, err := FromSettings(withSecret); err == nil || !strings.Contains(err.Error(), `host "other.test" is not in network.allow_domains`) {
		t.Errorf("secret for a host not allowed: %v", err)
	}
	withSecret.Secrets[0].Hosts = []string{"api.test"}
	st, err = FromSettings(withSecret)
	if err != nil {
		t.Fatal(err)
	}
	if st.Secrets == nil || !strings.Contains(string(st.CABundle), string(st.Proxy.opts.CA.CertPEM())) {
		t.Error("secrets configured, yet the sandbox bundle lacks the interception CA")
	}
	if strings.Contains(string(st.CABundle), "PRIVATE KEY") {
		t.Error("the sandbox bundle carries a private key")
	}
	rules := base
	rules.Allow = []AllowRule{{Domain: "api.test", Methods: []string{"GET"}}}
	if st, err = FromSettings(rules); err != nil || st.Proxy.opts.CA == nil {
		t.Errorf("an L7 rule without a CA: %v", err)
	}
}

// A WebSocket upgrade through an intercepted host passes under the same
// rules: the allowed path is switched and carries bytes both ways; a path
// outside the rule is refused before the upstream sees it.
func TestInterceptWebSocket(t *testing.T) {
	r := newInterceptRig(t)
	ws := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(c, brw)
	}))
	ws.EnableHTTP2 = true // the proxy must still reach it over HTTP/1.1
	ws.TLS = &tls.Config{Certificates: []tls.Certificate{getCert(t).tls}}
	ws.Config.ErrorLog = log.New(io.Discard, "", 0)
	ws.StartTLS()
	t.Cleanup(ws.Close)
	r.port = port(t, ws.URL)
	r.register(t, "127.0.0.2", "run1", []AllowRule{{Domain: "allowed.test", Methods: []string{"GET"}, Paths: []string{"/ws"}}}, nil)
	c := r.client("127.0.0.2", false)
	upgrade := func(path string) (*http.Response, error) {
		req, _ := http.NewRequest("GET", r.url("allowed.test", path), nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		return c.Transport.RoundTrip(req) // a Client with a timeout hides the 101's writable body
	}
	resp, err := upgrade("/ws")
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("a 101's body is not writable: %T", resp.Body)
	}
	defer rw.Close()
	if _, err := rw.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(rw, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo through the upgraded connection: %q %v", buf, err)
	}
	if resp, err := upgrade("/admin"); err != nil || resp.StatusCode != 403 {
		t.Errorf("upgrade outside the rule: %v %v", resp, err)
	}
}

// Tripwires are unique per run, look like what they imitate, and never
// take the name of a secret the run was given.
func TestTripwireValues(t *testing.T) {
	a, b := &Credentials{Env: map[string]string{}, Files: map[string]string{}}, &Credentials{Env: map[string]string{"GITHUB_TOKEN": "a-real-placeholder"}, Files: map[string]string{}}
	a.AddTripwires()
	b.AddTripwires()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "GH_TOKEN"} {
		if a.Env[k] == "" || a.Env[k] == b.Env[k] {
			t.Errorf("%s: %q and %q", k, a.Env[k], b.Env[k])
		}
	}
	if !strings.HasPrefix(a.Env["AWS_ACCESS_KEY_ID"], "AKIA") || len(a.Env["AWS_SECRET_ACCESS_KEY"]) != 40 || !strings.HasPrefix(a.Env["GITHUB_TOKEN"], "ghp_") {
		t.Errorf("implausible: %v", a.Env)
	}
	if b.Env["GITHUB_TOKEN"] != "a-real-placeholder" || b.Env["GH_TOKEN"] == "" || !slices.Contains(b.trips, b.Env["GH_TOKEN"]) {
		t.Errorf("a bound name was replaced, or the other name not watched: %v trips %v", b.Env, b.trips)
	}
	if !strings.Contains(a.Files[".netrc"], "password "+a.trips[len(a.trips)-1]) || a.Files[".netrc"] == b.Files[".netrc"] {
		t.Errorf(".netrc %q", a.Files[".netrc"])
	}
}

// Whatever the bytes, a stopping needle never passes, in any ASCII case,
// and a stream without one passes unchanged.
func FuzzScanner(f *testing.F) {
	f.Add([]byte("hello TRIPWIRE world"), uint8(3))
	f.Add([]byte(strings.Repeat("\xff", 33)+"tripwire"), uint8(1))
	f.Add([]byte("\u212a\u212atRiPwIrE"), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		sc := newScanner(io.NopCloser(&chunkReader{b: data, n: int(chunk%16) + 1}), []needle{{find: []byte("TRIPWIRE"), fold: true, stop: true}})
		got, err := io.ReadAll(sc)
		has := bytes.Contains(asciiLower(data), []byte("tripwire"))
		if bytes.Contains(asciiLower(got), []byte("tripwire")) {
			t.Fatalf("the needle passed: %q", got)
		}
		if has != (err != nil) {
			t.Fatalf("needle present %v, err %v", has, err)
		}
		if !has && !bytes.Equal(got, data) {
			t.Fatalf("changed a clean stream: %q -> %q", data, got)
		}
		if has && !bytes.HasPrefix(data, got) {
			t.Fatalf("output is not a prefix of the input: %q", got)
		}
	})
}

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	b []byte
	n int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}
