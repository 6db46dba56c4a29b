package kube

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// basePolicies are deploy/kubernetes/networkpolicy.yaml, decoded: the
// deny-all, and the networked pods' one way out.
func basePolicies(t *testing.T) []*networkingv1.NetworkPolicy {
	t.Helper()
	f, err := os.Open(filepath.Join(manifestDir, "networkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*networkingv1.NetworkPolicy
	for _, obj := range decodeManifests(t, f) {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok {
			t.Fatalf("networkpolicy.yaml holds a %T", obj)
		}
		out = append(out, np)
	}
	if len(out) == 0 || out[0].Name != "sandboxes-deny-all" || len(out[0].Spec.PodSelector.MatchLabels) != 0 || len(out[0].Spec.PolicyTypes) != 2 {
		t.Fatalf("networkpolicy.yaml does not start with the deny-all of every pod: %+v", out)
	}
	return out
}

// applyPolicy creates the base's policies in ns.
func applyPolicy(t *testing.T, cs *kubernetes.Clientset, ns string) {
	t.Helper()
	for _, np := range basePolicies(t) {
		np.Namespace = ns
		if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create the base's NetworkPolicy %s in %s: %v", np.Name, ns, err)
		}
	}
}

// netRuntimeClass is the test cluster's gVisor handler that keeps a
// network (runsc's own stack on the pod's interface; cluster.sh).
const netRuntimeClass = "gvisor-net"

// serverPod starts a pod that serves HTTP on 8080 and returns its address
// once it runs: under the cluster's default runtime (runc) when
// runtimeClass is empty, else under that class.
func serverPod(t *testing.T, cs *kubernetes.Clientset, ns, name, runtimeClass string) string {
	t.Helper()
	ctx := context.Background()
	no, yes, uid := false, true, int64(1000)
	var rc *string
	if runtimeClass != "" {
		rc = &runtimeClass
	}
	po := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RuntimeClassName:             rc,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			SecurityContext: &corev1.PodSecurityContext{RunAsUser: &uid, RunAsNonRoot: &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: Container, Image: testImage, ImagePullPolicy: corev1.PullNever, WorkingDir: "/tmp",
				Command: []string{"python3", "-m", "http.server", "8080"},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, po, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip string
	waitFor(t, 2*time.Minute, "pod "+ns+"/"+name+" running", func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ip = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && ip != "", nil
	})
	return ip
}

// connects reports whether a TCP connection from the pod to host:port
// opened within 2 s.
func connects(t *testing.T, rc *rest.Config, cs *kubernetes.Clientset, ns, pod, host string, port int) bool {
	t.Helper()
	const script = `import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("open")
except OSError as e:
    print("blocked", e)
`
	out, stderr, err := execIn(rc, cs, ns, pod, "python3", "-c", script, host, strconv.Itoa(port))
	if err != nil {
		t.Fatalf("probe from %s/%s to %s:%d: %v %s", ns, pod, host, port, err, stderr)
	}
	return strings.HasPrefix(out, "open")
}

// countingListener accepts on addr and counts connections by source
// address: the test's own witness of what reached the node.
type countingListener struct {
	ln   net.Listener
	mu   sync.Mutex
	seen map[string]int
}

func listenCounting(t *testing.T, addr string) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{ln: ln, seen: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			l.mu.Lock()
			l.seen[host]++
			l.mu.Unlock()
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return l
}

func (l *countingListener) port() int { return l.ln.Addr().(*net.TCPAddr).Port }

func (l *countingListener) from(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[ip]
}

// The base's deny-all NetworkPolicy, enforced by the test cluster's
// kube-router, cuts a networked pod in its namespace off, whether runc's
// or gVisor's own network stack sends: it reaches neither a listener the
// test owns on the node, nor the API server's Service, nor a pod
// elsewhere, and no pod reaches it. The same probes from a namespace
// without the policy connect, so each refusal is the policy's doing.
func TestSandboxNetworkPolicyOnCluster(t *testing.T) {
	cs, rc := needCluster(t)
	ctx := context.Background()
	fenced, open := testNamespace(t, cs), testNamespace(t, cs)
	applyPolicy(t, cs, fenced)
	fencedIP, openIP := serverPod(t, cs, fenced, "server", ""), serverPod(t, cs, open, "server", "")
	fencedGV, openGV := serverPod(t, cs, fenced, "gvisor", netRuntimeClass), serverPod(t, cs, open, "gvisor", netRuntimeClass)

	po, err := cs.CoreV1().Pods(fenced).Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeIP := nodeAddress(t, cs, po.Spec.NodeName)
	api, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln := listenCounting(t, net.JoinHostPort(nodeIP, "0"))

	// An enforcer programs a new pod's rules a moment after it has its
	// address: wait for the first refusal, then hold it to every probe.
	for _, pod := range []string{"server", "gvisor"} {
		waitFor(t, time.Minute, "the policy enforced for "+fenced+"/"+pod, func() (bool, error) {
			return !connects(t, rc, cs, fenced, pod, nodeIP, ln.port()), nil
		})
	}
	reachedBefore := map[string]int{fencedIP: ln.from(fencedIP), fencedGV: ln.from(fencedGV)}

	for _, c := range []struct {
		name          string
		ns, pod, host string
		port          int
		wantReach     bool
	}{
		{"fenced pod to the node's listener", fenced, "server", nodeIP, ln.port(), false},
		{"fenced pod to the API server's service", fenced, "server", api.Spec.ClusterIP, 443, false},
		{"fenced pod to a pod in another namespace", fenced, "server", openIP, 8080, false},
		{"pod in another namespace to the fenced pod", open, "server", fencedIP, 8080, false},
		{"fenced gVisor pod to the node's listener", fenced, "gvisor", nodeIP, ln.port(), false},
		{"fenced gVisor pod to the API server's service", fenced, "gvisor", api.Spec.ClusterIP, 443, false},
		{"fenced gVisor pod to a pod in another namespace", fenced, "gvisor", openIP, 8080, false},
		{"pod in another namespace to the fenced gVisor pod", open, "server", fencedGV, 8080, false},
		// The controls: the same targets from outside the policy, and
		// each fenced server seen up from inside its own pod.
		{"open pod to the node's listener", open, "server", nodeIP, ln.port(), true},
		{"open pod to the API server's service", open, "server", api.Spec.ClusterIP, 443, true},
		{"open gVisor pod to the node's listener", open, "gvisor", nodeIP, ln.port(), true},
		{"open gVisor pod to the open pod", open, "gvisor", openIP, 8080, true},
		{"fenced pod to its own address", fenced, "server", fencedIP, 8080, true},
		{"fenced gVisor pod to its own address", fenced, "gvisor", fencedGV, 8080, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := connects(t, rc, cs, c.ns, c.pod, c.host, c.port); got != c.wantReach {
				t.Errorf("connected = %v, want %v", got, c.wantReach)
			}
		})
	}
	for ip, before := range reachedBefore {
		if n := ln.from(ip) - before; n != 0 {
			t.Errorf("the node's listener accepted %d connections from fenced pod %s once the policy held", n, ip)
		}
	}
	for _, ip := range []string{openIP, openGV} {
		if ln.from(ip) == 0 {
			t.Errorf("the node's listener never saw open pod %s: the control proves nothing", ip)
		}
	}
}
