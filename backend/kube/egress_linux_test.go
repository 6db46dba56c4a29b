package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
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

	var mu sync.Mutex
	sources := map[string]int{}
	up, err := net.Listen("tcp", net.JoinHostPort(node, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		sources[host]++
		mu.Unlock()
		fmt.Fprintf(w, "hello from upstream %s", strings.Split(r.Host, ":")[0])
	})}
	go func() { _ = srv.Serve(up) }()
	t.Cleanup(func() { _ = srv.Close() })
	upPort := up.Addr().(*net.TCPAddr).Port

	cfg := netConfig(ns, node)
	cfg.Network.AllowDomains = []string{"api.test", "other.test"}
	cfg.Network.AllowPorts = []int{upPort}
	cfg.Network.Hosts = []config.HostEntry{{Name: "api.test", Addrs: []string{node}}, {Name: "other.test", Addrs: []string{node}}}
	cfg.Network.AllowPrivate = []string{node + "/32"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the test's config: %v", err)
	}
	m, err := Up(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	pu, err := url.Parse(m.o.Net.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxyPort, _ := strconv.Atoi(pu.Port())

	// The base's deny-all, and the one way out: the proxy. In a cluster
	// the proxy is airlock's pods (the base selects them); here airlock
	// runs on the node.
	applyPolicy(t, cs, ns)
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(int32(proxyPort))
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "to-the-proxy"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelNetwork: "allowlist"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: node + "/32"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

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
	for _, want := range []string{"proxy " + m.o.Net.URL, "hello from upstream api.test", "other: refused 403", "direct: blocked"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr: %s", want, res.Stdout, res.Stderr)
		}
	}
	if res.ExitCode != 0 {
		t.Errorf("exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	if len(res.EgressDenied) != 1 || res.EgressDenied[0].Host != "other.test" {
		t.Errorf("egress_denied = %+v, want other.test alone", res.EgressDenied)
	}
	mu.Lock()
	for src, n := range sources {
		if src != node {
			t.Errorf("the upstream saw %d connections from %s, past the proxy (which dials from %s)", n, src, node)
		}
	}
	if sources[node] != 1 {
		t.Errorf("the upstream saw %d requests through the proxy, want 1 (api.test)", sources[node])
	}
	mu.Unlock()

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
