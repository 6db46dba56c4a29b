package local_test

// Networked runs against a test "internet": a network namespace this test
// creates, joined to the host by a veth, with HTTP and HTTPS servers inside.
// Every address used ends on this machine: the test namespace's 10.77.0.2,
// the sandbox bridge, and the host's own addresses.

import (
	"archive/zip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

const (
	inetHostIP = "10.77.0.1"
	inetIP     = "10.77.0.2"
)

// testInternet starts HTTP (80) and HTTPS (443) servers in a fresh netns and
// returns the CA file that signs the HTTPS server's certificate.
func testInternet(t *testing.T) (caFile string) {
	t.Helper()
	return startInternet(t, "allowed.test", "other.test").ca
}

// inet is a running test internet: its namespace, and the CA, certificate
// and key of its HTTPS servers.
type inet struct {
	ns, ca, cert, key string
}

// startInternet is testInternet with the certificate's names given and
// the namespace returned, for tests that serve more in it.
func startInternet(t *testing.T, names ...string) inet {
	t.Helper()
	ns := "airlock-inet-" + runtime.NewRunID()[:6]
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	sh("ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh("ip", "link", "add", "vinet-h", "type", "veth", "peer", "name", "vinet-n")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "vinet-h").Run() })
	sh("ip", "link", "set", "vinet-n", "netns", ns)
	sh("ip", "addr", "add", inetHostIP+"/24", "dev", "vinet-h")
	sh("ip", "link", "set", "vinet-h", "up")
	sh("ip", "-n", ns, "addr", "add", inetIP+"/24", "dev", "vinet-n")
	sh("ip", "-n", ns, "link", "set", "vinet-n", "up")
	sh("ip", "-n", ns, "link", "set", "lo", "up")

	dir := t.TempDir()
	caFile, certFile, keyFile := writeCerts(t, dir, names...)
	www := filepath.Join(dir, "www")
	_ = os.MkdirAll(filepath.Join(www, "simple", "tinypkg"), 0o755)
	_ = os.WriteFile(filepath.Join(www, "hello.txt"), []byte("hello from the test internet\n"), 0o644)
	writeTinyIndex(t, www)
	server := `import http.server, ssl, sys, functools
port = int(sys.argv[1])
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
s = http.server.ThreadingHTTPServer((sys.argv[3], port), h)
if port == 443:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
`
	for _, port := range []string{"80", "443"} {
		cmd := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", "-c", server, port, www, inetIP, certFile, keyFile)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	// Wait until both answer (from the host, into the test's own namespace).
	deadline := time.Now().Add(10 * time.Second)
	for _, port := range []string{"80", "443"} {
		for {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(inetIP, port), time.Second)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("test server on %s did not start: %v", port, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return inet{ns: ns, ca: caFile, cert: certFile, key: keyFile}
}

// writeTinyIndex serves a PEP 503 "simple" index with one pure-Python wheel.
func writeTinyIndex(t *testing.T, www string) {
	t.Helper()
	const whl = "tinypkg-1.0-py3-none-any.whl"
	_ = os.MkdirAll(filepath.Join(www, "packages"), 0o755)
	f, err := os.Create(filepath.Join(www, "packages", whl))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for name, body := range map[string]string{
		"tinypkg/__init__.py":            "VERSION = '1.0'\n",
		"tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
		"tinypkg-1.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"tinypkg-1.0.dist-info/RECORD":   "tinypkg/__init__.py,,\ntinypkg-1.0.dist-info/METADATA,,\ntinypkg-1.0.dist-info/WHEEL,,\ntinypkg-1.0.dist-info/RECORD,,\n",
	} {
		w, _ := zw.Create(name)
		_, _ = w.Write([]byte(body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	page := `<!DOCTYPE html><html><body><a href="/packages/` + whl + `">` + whl + `</a></body></html>`
	_ = os.WriteFile(filepath.Join(www, "simple", "tinypkg", "index.html"), []byte(page), 0o644)
}

func writeCerts(t *testing.T, dir string, names ...string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "airlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, _ := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	_ = os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o644)
	_ = os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return ca, cert, key
}

// netConfig is the test's network configuration: its own bridge, subnet
// and proxy port, names mapped into the test internet.
func netConfig(caFile string) config.Config {
	cfg := testConfig()
	cfg.Network = config.Defaults().Network
	cfg.Network.AllowDomains = []string{"allowed.test", "*.wild.test"}
	cfg.Network.Hosts = []config.HostEntry{
		{Name: "allowed.test", Addrs: []string{inetIP}},
		{Name: "other.test", Addrs: []string{inetIP}},
		{Name: "a.wild.test", Addrs: []string{inetIP}},
		{Name: "loop.wild.test", Addrs: []string{"127.0.0.1"}},
		// Refused before any dial: nothing is ever sent to these.
		{Name: "priv.wild.test", Addrs: []string{"10.1.2.3"}},
		{Name: "meta.wild.test", Addrs: []string{"169.254.77.77"}},
	}
	cfg.Network.AllowPrivate = []string{"10.77.0.0/24"}
	cfg.Network.CAFile = caFile
	cfg.Network.Bridge = "airlockt0"
	cfg.Network.Subnet = "10.89.250.0/24"
	cfg.Network.ProxyPort = 3129
	return cfg
}

// removeTestNetwork removes the firewall and bridge of the test's network.
// Close leaves them while other instances (this suite's main stack) live.
func removeTestNetwork(cfg config.Config, instanceID string) {
	ncfg, err := boot.NetworkConfig(cfg, instanceID)
	if err != nil {
		return
	}
	if nm, err := network.New(ncfg); err == nil {
		_ = nm.RemoveFirewall()
		_ = nm.RemoveBridge()
	}
}

// netStack brings up a second runtime with networking configured for the
// test internet.
func netStack(t *testing.T) *boot.Stack {
	t.Helper()
	need(t)
	cfg := netConfig(testInternet(t))
	s, err := boot.Up(context.Background(), cfg, boot.NeedManager, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	if s.Egress == nil {
		s.Close(context.Background())
		t.Fatal("stack offers no network")
	}
	t.Cleanup(func() {
		s.Close(context.Background())
		removeTestNetwork(cfg, s.Instance.ID)
	})
	return s
}

func netRun(t *testing.T, s *boot.Stack, lang runtime.Language, code string, domains ...string) runtime.Result {
	t.Helper()
	pol := *s.Egress
	if len(domains) > 0 {
		var err error
		if pol, err = s.Egress.Narrow(domains); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Manager.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: limits(), Egress: &pol})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func hasDenial(r runtime.Result, host, reason string) bool {
	for _, d := range r.EgressDenied {
		if d.Host == host && d.Reason == reason {
			return true
		}
	}
	return false
}

func TestEgressAllowList(t *testing.T) {
	s := netStack(t)
	cases := []struct {
		name     string
		lang     runtime.Language
		code     string
		contains string
		denied   string // host expected in egress_denied
		reason   string
	}{
		{"python urllib http", runtime.Python, "import urllib.request\nprint(urllib.request.urlopen('http://allowed.test/hello.txt', timeout=10).read().decode())", "hello from the test internet", "", ""},
		{"python urllib https", runtime.Python, "import urllib.request\nprint(urllib.request.urlopen('https://allowed.test/hello.txt', timeout=10).read().decode())", "hello from the test internet", "", ""},
		{"curl https", runtime.Shell, "curl -sS --max-time 10 https://allowed.test/hello.txt", "hello from the test internet", "", ""},
		// pip install is in the monitor's benign table: it must give no attempts.
		{"pip install", runtime.Shell, "python3 -m pip install -q --no-deps --index-url https://allowed.test/simple --target /workspace/site tinypkg && PYTHONPATH=/workspace/site python3 -c 'import tinypkg; print(\"tinypkg\", tinypkg.VERSION)'", "tinypkg 1.0", "", ""},
		{"pip download", runtime.Shell, "python3 -m pip download --no-deps --index-url https://allowed.test/simple -d /workspace/dl tinypkg >/dev/null && ls /workspace/dl", "tinypkg-1.0-py3-none-any.whl", "", ""},
		{"wildcard", runtime.Shell, "curl -sS --max-time 10 http://a.wild.test/hello.txt", "hello from the test internet", "", ""},
		{"name not on the list", runtime.Shell, "curl -sS --max-time 10 http://other.test/hello.txt; echo rc=$?", "rc=", "other.test", egress.ReasonNotAllowed},
		{"allowed name pointing at loopback", runtime.Shell, "curl -sS --max-time 10 http://loop.wild.test/; echo rc=$?", "rc=", "loop.wild.test", egress.ReasonPrivate},
		{"allowed name pointing at a private address", runtime.Shell, "curl -sS --max-time 10 http://priv.wild.test/; echo rc=$?", "rc=", "priv.wild.test", egress.ReasonPrivate},
		{"allowed name pointing at a link-local (metadata stand-in) address", runtime.Shell, "curl -sS --max-time 10 http://meta.wild.test/; echo rc=$?", "rc=", "meta.wild.test", egress.ReasonPrivate},
		{"ignoring the proxy fails closed", runtime.Shell, "curl -sS --noproxy '*' --max-time 5 http://" + inetIP + "/hello.txt; echo rc=$?", "rc=", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := netRun(t, s, c.lang, c.code)
			out := r.Stdout + r.Stderr
			if !strings.Contains(out, c.contains) {
				t.Errorf("output %q lacks %q", out, c.contains)
			}
			if c.denied != "" && !hasDenial(r, c.denied, c.reason) {
				t.Errorf("egress_denied = %+v, want %s: %s", r.EgressDenied, c.denied, c.reason)
			}
			if c.denied == "" && c.name != "ignoring the proxy fails closed" {
				if len(r.EgressDenied) > 0 {
					t.Errorf("unexpected denials %+v", r.EgressDenied)
				}
				// Allowed traffic is ordinary: gVisor's monitor saw nothing.
				if len(r.Attempts) > 0 {
					t.Errorf("an allowed download gave attempts %+v", r.Attempts)
				}
			}
			if c.name == "ignoring the proxy fails closed" {
				if strings.Contains(out, "hello from") {
					t.Errorf("direct connection to the test host succeeded: %q", out)
				}
				// The monitor is on in this stack (so the zero attempts of
				// the allowed rows mean something): it saw the refused connect.
				if len(r.Attempts) != 1 || r.Attempts[0].Kind != "connect_blocked" {
					t.Errorf("attempts %+v, want the blocked connect", r.Attempts)
				}
			}
		})
	}
	// A call that narrowed its list to a.wild.test is refused allowed.test.
	r := netRun(t, s, runtime.Shell, "curl -sS --max-time 10 http://allowed.test/hello.txt; echo rc=$?", "a.wild.test")
	if strings.Contains(r.Stdout, "hello from") || !hasDenial(r, "allowed.test", egress.ReasonNotAllowed) {
		t.Errorf("narrowed run reached allowed.test: %+v", r)
	}
	// SNI naming another host than the CONNECT target.
	r = netRun(t, s, runtime.Python, sniProbe)
	if strings.Contains(r.Stdout, "handshake ok") || !hasDenial(r, "allowed.test", egress.ReasonSNI) {
		t.Errorf("SNI mismatch not refused: out %q err %q denials %+v", r.Stdout, r.Stderr, r.EgressDenied)
	}
	assertNoSandboxes(t, s)
}

// sniProbe sends CONNECT allowed.test:443 to the proxy, then a ClientHello
// for other.test (the test certificate is valid for both, so only the proxy
// can refuse it).
const sniProbe = `import os, socket, ssl
proxy = os.environ["HTTPS_PROXY"].split("//")[1]
host, port = proxy.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0])
ctx = ssl.create_default_context()
try:
    t = ctx.wrap_socket(s, server_hostname="other.test")
    print("handshake ok")
except Exception as e:
    print("refused", type(e).__name__)
`

// The sandbox reaches nothing but the proxy: not the gateway's other ports,
// not the host's own addresses, not the test host directly.
func TestEgressOnlyTheProxy(t *testing.T) {
	s := netStack(t)
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hits := make(chan struct{}, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			hits <- struct{}{}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	targets := []string{"10.89.250.1", inetHostIP, inetIP}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !strings.HasPrefix(ipn.IP.String(), "10.89.250.") {
			targets = append(targets, ipn.IP.String())
		}
	}
	code := fmt.Sprintf("import socket\nfor h in %q.split():\n  for p in (%d, 80, 22):\n    s = socket.socket(); s.settimeout(2)\n    try:\n      s.connect((h, p)); print('connected', h, p)\n    except OSError as e: print('failed', h, p)\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n  s.sendto(b'x', ('10.89.250.1', 53)); s.settimeout(2); s.recv(10); print('udp answered')\nexcept OSError: print('udp failed')", strings.Join(targets, " "), port)
	r := netRun(t, s, runtime.Python, code)
	if strings.Contains(r.Stdout, "connected") || strings.Contains(r.Stdout, "udp answered") || !strings.Contains(r.Stdout, "failed") {
		t.Errorf("sandbox reached something besides the proxy:\n%s%s", r.Stdout, r.Stderr)
	}
	if len(hits) != 0 {
		t.Errorf("host listener saw %d connections", len(hits))
	}
}

// Networked runs leave no namespace, veth or address allocation behind.
func TestEgressNoLeaks(t *testing.T) {
	s := netStack(t)
	for i := 0; i < 50; i++ {
		code := []string{"curl -sS --max-time 5 http://allowed.test/hello.txt", "exit 3", "curl -sS --max-time 5 http://other.test/", "sleep 5"}[i%4]
		l := limits()
		l.Timeout = 2 * time.Second
		pol := *s.Egress
		if _, err := s.Manager.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: code, Limits: l, Egress: &pol}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	assertNoSandboxes(t, s)
	out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	if strings.Contains(string(out), s.Instance.ID) {
		t.Errorf("namespaces left behind:\n%s", out)
	}
	links, _ := exec.Command("ip", "-o", "link", "show", "master", "airlockt0").CombinedOutput()
	if strings.TrimSpace(string(links)) != "" {
		t.Errorf("veths left on the bridge:\n%s", links)
	}
	entries, _ := os.ReadDir(filepath.Join(s.Config.StateDir, "ipam", "airlock-airlockt0"))
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("address allocation %s left behind", e.Name())
		}
	}
}

// A server killed with SIGKILL mid-run leaves its sandbox, network namespace
// and address behind; the next start removes them, and leaves a live
// instance's sandbox (a session of the test's own stack) alone.
func TestEgressRecoveryAfterSIGKILL(t *testing.T) {
	live := need(t)
	sess, err := live.Manager.OpenSession(context.Background(), runtime.SessionOptions{ID: "s" + runtime.NewRunID(), Limits: limits()})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	bin := filepath.Join(t.TempDir(), "airlock")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/airlock-mcp/airlock").CombinedOutput(); err != nil {
		t.Fatalf("build airlock: %v: %s", err, out)
	}
	cfg := netConfig("")
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	// No pool: its sandboxes, being made or checkpointed for a template
	// when the kill lands, may end on their own, and the test needs the
	// one sandbox it knows is running (the run's).
	yaml := fmt.Sprintf("state_dir: %s\nlog: {level: warn}\npool: {size: 0}\nnetwork:\n  allow_domains: [allowed.test]\n  bridge: %s\n  subnet: %s\n  proxy_port: %d\n",
		cfg.StateDir, cfg.Network.Bridge, cfg.Network.Subnet, cfg.Network.ProxyPort)
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfgFile, "run", "shell", "--network", "allowlist", "--timeout", "120", "sleep 120")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// Its instance id is in the lock file that holds its pid. It is killed
	// once its run's code runs in a sandbox under gVisor and a network
	// namespace of its exists: a sandbox still waiting for its work would
	// end on its own when the host's end of its stdin closes.
	lctx := namespaces.WithNamespace(context.Background(), cfg.Containerd.Namespace)
	running := func(victim string) (left []containerd.Container, ok bool) {
		left, _ = live.Client.Containers(lctx, "labels.\""+local.LabelInstance+"\"=="+victim)
		for _, c := range left {
			task, err := c.Task(lctx, nil)
			if err != nil {
				continue
			}
			if st, err := task.Status(lctx); err == nil && st.Status == containerd.Running &&
				len(sentryPIDs(t, c.ID())) > 0 && sandboxRuns(t, live, c.ID(), "sleep") {
				return left, netnsExists(victim)
			}
		}
		return left, false
	}
	var victim string
	deadline := time.Now().Add(60 * time.Second)
	for {
		if victim == "" {
			victim = instanceOfPid(cfg.StateDir, cmd.Process.Pid)
		}
		if _, ok := running(victim); victim != "" && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the networked run never started (instance %q)", victim)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	left, ok := running(victim)
	if !ok {
		t.Fatal("nothing was left behind to clean up; the test proves nothing")
	}

	s, err := boot.Up(context.Background(), cfg, boot.NeedManager, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Close(context.Background())
		removeTestNetwork(cfg, s.Instance.ID)
	}()
	if netnsExists(victim) {
		t.Errorf("network namespace of killed instance %s survived the restart", victim)
	}
	ctx := namespaces.WithNamespace(context.Background(), cfg.Containerd.Namespace)
	cs, _ := s.Client.Containers(ctx, "labels.\""+local.LabelInstance+"\"=="+victim)
	if len(cs) != 0 {
		t.Errorf("%d containers of killed instance %s survived the restart", len(cs), victim)
	}
	entries, _ := os.ReadDir(filepath.Join(cfg.StateDir, "ipam", "airlock-"+cfg.Network.Bridge))
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("address allocation %s survived the restart", e.Name())
		}
	}
	// A sandbox's processes end just after its task is deleted.
	for _, c := range left {
		var pids []int
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if pids = sentryPIDs(t, c.ID()); len(pids) == 0 {
				break
			}
		}
		if len(pids) > 0 {
			t.Errorf("the killed instance's sandbox %s still runs 10 s after the restart (runsc pids %v)", c.ID(), pids)
		}
	}
	r, err := sess.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print('still here')", Limits: limits()})
	if err != nil || r.Stdout != "still here\n" {
		t.Errorf("the live instance's session was touched by the cleanup: %+v, %v", r, err)
	}
}

func netnsExists(instanceID string) bool {
	out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	return strings.Contains(string(out), "airlock-"+instanceID+"-")
}

// sandboxRuns reports whether a process named name runs inside sandbox id,
// as runsc itself lists them.
func sandboxRuns(t *testing.T, s *boot.Stack, id, name string) bool {
	t.Helper()
	root := filepath.Join(local.RunscRoot(s.Deployment), s.Config.Containerd.Namespace)
	out, err := exec.Command(s.Config.Runtime.Runsc, "--root", root, "ps", id).Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == name {
			return true
		}
	}
	return false
}

func instanceOfPid(stateDir string, pid int) string {
	entries, _ := os.ReadDir(filepath.Join(stateDir, "instances"))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(stateDir, "instances", e.Name()))
		if err == nil && strings.TrimSpace(string(b)) == fmt.Sprint(pid) {
			return strings.TrimSuffix(e.Name(), ".lock")
		}
	}
	return ""
}

// Two airlock instances on one host both serve networked runs, each through
// its own proxy; neither proxy serves the other's sandboxes.
func TestEgressTwoInstances(t *testing.T) {
	a := netStack(t)
	b, err := boot.Up(context.Background(), a.Config, boot.NeedManager, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if b.Egress == nil {
		t.Fatal("second instance offers no network")
	}
	for name, s := range map[string]*boot.Stack{"first": a, "second": b} {
		r := netRun(t, s, runtime.Shell, "echo $HTTP_PROXY; curl -sS --max-time 10 http://allowed.test/hello.txt")
		if !strings.Contains(r.Stdout, "hello from the test internet") {
			t.Errorf("%s instance: %q %q", name, r.Stdout, r.Stderr)
		}
	}
	ra := netRun(t, a, runtime.Shell, "echo $HTTP_PROXY")
	rb := netRun(t, b, runtime.Shell, "echo $HTTP_PROXY")
	if ra.Stdout == rb.Stdout {
		t.Errorf("both instances' sandboxes use proxy %s", ra.Stdout)
	}
	// A sandbox of b sent to a's proxy is refused: a never registered it.
	aProxy := strings.TrimSpace(ra.Stdout)
	r := netRun(t, b, runtime.Shell, "curl -sS -o /dev/null -w '%{http_code}' --proxy "+aProxy+" --max-time 10 http://allowed.test/hello.txt")
	if r.Stdout != "403" {
		t.Errorf("other instance's proxy answered %q, want 403", r.Stdout)
	}
}
