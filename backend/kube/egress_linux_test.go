package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// nodeAddress is the InternalIP of node name (empty: the first node that
// has one): where the test's own listeners go, reachable from pods and
// never routed off the machine.
func nodeAddress(t *testing.T, cs *kubernetes.Clientset, name string) string {
	t.Helper()
	nodes, err := cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if name != "" && n.Name != name {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address
			}
		}
	}
	t.Fatalf("no node %q with an InternalIP", name)
	return ""
}

// netConfig is a Kubernetes backend on namespace ns offering networked
// runs through a proxy on the node (airlock runs there, not in a pod).
func netConfig(ns, node string) config.Config {
	cfg := config.Defaults()
	cfg.Runtime.Backend = config.BackendKubernetes
	cfg.Kubernetes.Kubeconfig, cfg.Kubernetes.Namespace = testKubeconfig(), ns
	cfg.Kubernetes.NetworkRuntimeClass = netRuntimeClass
	cfg.Kubernetes.EgressListen, cfg.Kubernetes.EgressAddress = net.JoinHostPort(node, "0"), node
	cfg.Pool.Size = 0
	cfg.Image = testImage
	return cfg
}

// upstream is an HTTP server of the test's on the node, standing in for
// the domains the tests allow: it answers with the name asked for and
// counts requests by source address.
type upstream struct {
	port    int
	mu      sync.Mutex
	sources map[string]int
}

func startUpstream(t *testing.T, node string) *upstream {
	t.Helper()
	u := &upstream{sources: map[string]int{}}
	ln, err := net.Listen("tcp", net.JoinHostPort(node, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		u.mu.Lock()
		u.sources[host]++
		u.mu.Unlock()
		fmt.Fprintf(w, "hello from upstream %s", strings.Split(r.Host, ":")[0])
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	u.port = ln.Addr().(*net.TCPAddr).Port
	return u
}

// only checks that every request came from the proxies' address (the
// node), and that there were want of them.
func (u *upstream) only(t *testing.T, node string, want int) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	for src, n := range u.sources {
		if src != node {
			t.Errorf("the upstream saw %d connections from %s, past the proxy (which dials from %s)", n, src, node)
		}
	}
	if u.sources[node] != want {
		t.Errorf("the upstream saw %d requests through the proxy, want %d", u.sources[node], want)
	}
}

// netTestConfig is netConfig allowing api.test and other.test, both the
// upstream on the node.
func netTestConfig(t *testing.T, ns, node string, up *upstream) config.Config {
	t.Helper()
	cfg := netConfig(ns, node)
	cfg.Network.AllowDomains = []string{"api.test", "other.test"}
	cfg.Network.AllowPorts = []int{up.port}
	cfg.Network.Hosts = []config.HostEntry{{Name: "api.test", Addrs: []string{node}}, {Name: "other.test", Addrs: []string{node}}}
	cfg.Network.AllowPrivate = []string{node + "/32"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the test's config: %v", err)
	}
	return cfg
}

// upNet starts a Manager from cfg, as one airlock replica on the node,
// and returns it with its egress proxy's port.
func upNet(t *testing.T, cfg config.Config) (*Manager, int) {
	t.Helper()
	m, err := Up(context.Background(), cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m, int(m.o.Net.Addr.Port())
}

// deniedOnly checks that a result's egress_denied names host alone.
func deniedOnly(t *testing.T, what string, res runtime.Result, host string) {
	t.Helper()
	if len(res.EgressDenied) != 1 || res.EgressDenied[0].Host != host {
		t.Errorf("%s: egress_denied = %+v, want %s alone", what, res.EgressDenied, host)
	}
}

// fenceForProxies applies the base's deny-all and lets networked pods
// reach the node on the proxies' ports only. In a cluster the proxies are
// airlock's pods (the base's sandboxes-egress-proxy selects them); here
// airlock runs on the node.
func fenceForProxies(t *testing.T, cs *kubernetes.Clientset, ns, node string, ports ...int) {
	t.Helper()
	applyPolicy(t, cs, ns)
	tcp := corev1.ProtocolTCP
	var allowed []networkingv1.NetworkPolicyPort
	for _, p := range ports {
		port := intstr.FromInt32(int32(p))
		allowed = append(allowed, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &port})
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(context.Background(), &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "to-the-proxy"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelNetwork: "allowlist"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: node + "/32"}}},
				Ports: allowed,
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A networked run on the cluster: a gVisor pod with a network, whose code
// reaches the domain the call allowed through this airlock's egress proxy
// (the host backend's code), is refused another, and cannot get past the
// proxy: the namespace's deny-all policy lets it reach only the proxy's
// port. The upstream, a server of the test's own, sees only the proxy.
func TestNetworkedRunOnCluster(t *testing.T) {
	cs, _ := needCluster(t)
	ctx := context.Background()
	ns := testNamespace(t, cs)
	node := nodeAddress(t, cs, "")
	up := startUpstream(t, node)
	upPort := up.port
	m, proxyPort := upNet(t, netTestConfig(t, ns, node, up))
	fenceForProxies(t, cs, ns, node, proxyPort)

	call, err := m.o.Net.Policy.Narrow([]string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	code := fmt.Sprintf(`import os, socket, urllib.request, urllib.error
print("proxy", os.environ.get("HTTPS_PROXY"))
print(urllib.request.urlopen("http://api.test:%[1]d/", timeout=20).read().decode())
try:
    urllib.request.urlopen("http://other.test:%[1]d/", timeout=20)
    print("other: reached")
except urllib.error.HTTPError as e:
    print("other: refused", e.code)
try:
    socket.create_connection(("%[2]s", %[1]d), timeout=3).close()
    print("direct: open")
except OSError as e:
    print("direct: blocked", e)
`, upPort, node)
	res, err := m.Run(ctx, runtime.Request{Language: runtime.Python, Code: code, Limits: testLimits(), Egress: &call})
	if err != nil {
		t.Fatalf("networked run: %v", err)
	}
	for _, want := range []string{"proxy " + m.o.Net.URL(), "hello from upstream api.test", "other: refused 403", "direct: blocked"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr: %s", want, res.Stdout, res.Stderr)
		}
	}
	if res.ExitCode != 0 {
		t.Errorf("exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	deniedOnly(t, "the run", res, "other.test")
	up.only(t, node, 1) // api.test

	// A run without a network keeps gVisor's handler without one.
	res, err = m.Run(ctx, runtime.Request{Language: runtime.Shell, Code: "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", Limits: testLimits()})
	if err != nil || strings.TrimSpace(res.Stdout) != "lo" {
		t.Errorf("a run without network: %v %q; want only lo", err, res.Stdout)
	}
	m.WaitTeardowns()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("%d pods left after the runs", len(pods.Items))
	}
}

// Where nothing lets a networked pod out, nothing holds it in either
// (here: no policy at all in the namespace), and the driver refuses to
// run its code: the run fails and says why.
func TestNetworkedRunRefusedUnfenced(t *testing.T) {
	cs, _ := needCluster(t)
	ns := testNamespace(t, cs)
	node := nodeAddress(t, cs, "")
	cfg := netConfig(ns, node)
	cfg.Network.AllowDomains = []string{"api.test"}
	m, err := Up(context.Background(), cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	pol := m.o.Net.Policy
	res, err := m.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: "echo ran", Limits: testLimits(), Egress: &pol})
	if err == nil || !strings.Contains(err.Error(), "nothing enforces the sandbox namespace's deny-all NetworkPolicy") {
		t.Errorf("run in an unfenced namespace: err = %v, stdout %q; want the driver's refusal", err, res.Stdout)
	}
	if strings.Contains(res.Stdout, "ran") {
		t.Error("the code ran in an unfenced pod")
	}
}

// A networked session outlives the replica that opened it. Its code is
// told of one proxy, the driver's relay on the pod's loopback; the replica
// that takes the session over lets the pod through its own proxy and
// points the relay there, so what the code cached (urllib's opener) keeps
// working; that replica's results carry the refusals; and the first
// replica lets the pod's address go, so its proxy refuses it.
func TestNetworkedSessionOnCluster(t *testing.T) {
	cs, _ := needCluster(t)
	ctx := context.Background()
	ns := testNamespace(t, cs)
	node := nodeAddress(t, cs, "")
	up := startUpstream(t, node)
	cfg := netTestConfig(t, ns, node, up)
	a, aPort := upNet(t, cfg)
	b, bPort := upNet(t, cfg)
	fenceForProxies(t, cs, ns, node, aPort, bPort)

	pol, err := a.o.Net.Policy.Narrow([]string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	id := "s" + runtime.NewRunID()
	sa, err := a.OpenSession(ctx, runtime.SessionOptions{ID: id, Limits: testLimits(), Egress: &pol, Owner: "alice", Idle: 5 * time.Minute, Lifetime: 10 * time.Minute})
	if err != nil {
		t.Fatalf("open a networked session: %v", err)
	}
	t.Cleanup(sa.Close)
	proxyA, proxyB := fmt.Sprintf("http://%s:%d", node, aPort), fmt.Sprintf("http://%s:%d", node, bPort)
	res, err := runPython(sa, fmt.Sprintf(`import os, urllib.request, urllib.error
def get(host, proxy=None):
    open_ = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy})).open if proxy else urllib.request.urlopen
    try:
        return open_("http://%%s:%d/" %% host, timeout=20).read().decode()
    except urllib.error.HTTPError as e:
        return "refused %%d %%s" %% (e.code, e.read().decode().strip())
    except OSError as e:
        return "failed %%s" %% e
print("proxy", os.environ["HTTP_PROXY"])
print("api:", get("api.test"))
print("other:", get("other.test"))
print("via A:", get("api.test", %q))
print("via B:", get("api.test", %q))
`, up.port, proxyA, proxyB))
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	for _, want := range []string{"proxy http://" + SessionRelay, "api: hello from upstream api.test", "other: refused 403",
		"via A: hello from upstream api.test", "via B: refused 403 egress: this source address is not registered"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("first call (on A): stdout lacks %q:\n%s\nstderr: %s", want, res.Stdout, res.Stderr)
		}
	}
	deniedOnly(t, "the first call", res, "other.test")

	sb, rec, err := b.AdoptSession(ctx, id, "alice")
	if err != nil {
		t.Fatalf("take the networked session over: %v", err)
	}
	t.Cleanup(sb.Close)
	if rec.Egress == nil || strings.Join(rec.Egress.Domains(), ",") != "api.test" {
		t.Errorf("the taken-over session's allow-list: %v, want api.test", rec.Egress)
	}
	// A lets go of the pod's address as soon as it sees B's hello.
	waitFor(t, 30*time.Second, "the first replica to see the takeover", func() (bool, error) { return sa.Lost(), nil })
	res, err = runPython(sb, fmt.Sprintf(`print("api:", get("api.test"))
print("other:", get("other.test"))
print("via A:", get("api.test", %q))
print("via B:", get("api.test", %q))
`, proxyA, proxyB))
	if err != nil {
		t.Fatalf("call after the takeover: %v", err)
	}
	for _, want := range []string{"api: hello from upstream api.test", "other: refused 403",
		"via A: refused 403 egress: this source address is not registered", "via B: hello from upstream api.test"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("call on B: stdout lacks %q:\n%s\nstderr: %s", want, res.Stdout, res.Stderr)
		}
	}
	deniedOnly(t, "the call on B (B's proxy)", res, "other.test")
	up.only(t, node, 4) // api.test through each proxy, by the relay and directly
	sb.Close()
	b.WaitTeardowns()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSession + "=" + id})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("session pods left after close: %d (%v)", len(pods.Items), err)
	}
}

// A tripwire on the cluster: the pod gets its run's fake credentials
// through the driver's work frame, and the moment one crosses this
// replica's proxy the pod is deleted and the result says so.
func TestTripwireOnCluster(t *testing.T) {
	cs, _ := needCluster(t)
	ctx := context.Background()
	ns := testNamespace(t, cs)
	node := nodeAddress(t, cs, "")
	up := startUpstream(t, node)
	cfg := netTestConfig(t, ns, node, up)
	cfg.Network.Tripwires = true
	cfg.StateDir = t.TempDir() // the interception CA's home
	m, proxyPort := upNet(t, cfg)
	fenceForProxies(t, cs, ns, node, proxyPort)

	creds, err := (*egress.Secrets)(nil).Bind(nil)
	if err != nil {
		t.Fatal(err)
	}
	creds.AddTripwires()
	pol := m.o.Net.Policy.WithCredentials(creds)
	code := fmt.Sprintf(`import os, time, urllib.request
print("clean", urllib.request.urlopen("http://api.test:%[1]d/", timeout=20).status, flush=True)
try:
    urllib.request.urlopen("http://api.test:%[1]d/?k=" + os.environ["AWS_SECRET_ACCESS_KEY"], timeout=20)
except Exception as e:
    print("refused", e, flush=True)
time.sleep(2)
print("still running", flush=True)
time.sleep(60)
`, up.port)
	res, err := m.Run(ctx, runtime.Request{Language: runtime.Python, Code: code, Limits: testLimits(), Egress: &pol, Env: creds.Env, HomeFiles: creds.Files})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if res.Reason != runtime.ReasonTripwire || !strings.Contains(res.Stdout, "clean 200") || strings.Contains(res.Stdout, "still running") {
		t.Errorf("reason %q stdout %q stderr %q: want the pod killed by the tripwire after one clean request", res.Reason, res.Stdout, res.Stderr)
	}
	if len(res.EgressDenied) != 1 || res.EgressDenied[0].Reason != egress.ReasonTripwire || res.EgressDenied[0].Host != "api.test" {
		t.Errorf("egress_denied = %+v", res.EgressDenied)
	}
	up.only(t, node, 1) // the clean request alone
}

// A networked session given tripwires (or secrets) cannot move: another
// replica's proxy knows neither its placeholders nor its fake values, so
// taking it over ends it, with a message, rather than serving it with
// its tripwires unwatched.
func TestSessionWithCredentialsIsNotTakenOver(t *testing.T) {
	cs, _ := needCluster(t)
	ctx := context.Background()
	ns := testNamespace(t, cs)
	node := nodeAddress(t, cs, "")
	up := startUpstream(t, node)
	cfg := netTestConfig(t, ns, node, up)
	cfg.Network.Tripwires = true
	cfg.StateDir = t.TempDir()
	a, aPort := upNet(t, cfg)
	b, bPort := upNet(t, cfg)
	fenceForProxies(t, cs, ns, node, aPort, bPort)

	creds, err := (*egress.Secrets)(nil).Bind(nil)
	if err != nil {
		t.Fatal(err)
	}
	creds.AddTripwires()
	pol := a.o.Net.Policy.WithCredentials(creds)
	id := "s" + runtime.NewRunID()
	sa, err := a.OpenSession(ctx, runtime.SessionOptions{ID: id, Limits: testLimits(), Egress: &pol, Owner: "alice", Idle: 5 * time.Minute, Lifetime: 10 * time.Minute, Env: creds.Env, HomeFiles: creds.Files})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(sa.Close)
	if _, _, err := b.AdoptSession(ctx, id, "alice"); err == nil || !strings.Contains(err.Error(), "secrets or tripwires") {
		t.Fatalf("takeover: %v, want a refusal naming the secrets and tripwires", err)
	}
	waitFor(t, 60*time.Second, "the session's pod to be gone", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSession + "=" + id})
		return err == nil && len(pods.Items) == 0, err
	})
}
