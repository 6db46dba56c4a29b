package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlock-mcp/airlock/runtime/netns/netnstest"
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

// sendsUDP sends three DNS queries (for airlock.test) from the pod to
// host:port; whether they arrive is for the test's listener to say.
func sendsUDP(t *testing.T, rc *rest.Config, cs *kubernetes.Clientset, ns, pod, host string, port int) {
	t.Helper()
	const script = `import socket, sys
q = bytes.fromhex("a1a201000001000000000000076169726c6f636b04746573740000010001")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    try:
        s.sendto(q, (sys.argv[1], int(sys.argv[2])))
    except OSError as e:
        print("blocked", e)
`
	if _, stderr, err := execIn(rc, cs, ns, pod, "python3", "-c", script, host, strconv.Itoa(port)); err != nil {
		t.Fatalf("udp from %s/%s to %s:%d: %v %s", ns, pod, host, port, err, stderr)
	}
}

// inputCounter counts, in a table of the test's own, the TCP packets from
// each of srcs to the node's port that the host's filters let through to
// its sockets: its chain hooks input after the filter table (where the
// enforcer's iptables rules are), so a dropped packet is never counted.
// For a port the test does not listen on, such as the kubelet's.
func inputCounter(t *testing.T, port int, srcs ...string) func(src string) int {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	table := "airlock_test_" + hex.EncodeToString(b)
	var rules strings.Builder
	for _, ip := range srcs {
		fmt.Fprintf(&rules, "    ip saddr %s tcp dport %d counter comment %q\n", ip, port, ip)
	}
	script := fmt.Sprintf("table ip %s {\n  chain input {\n    type filter hook input priority 10; policy accept;\n%s  }\n}\n", table, rules.String())
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f (%s): %v %s", script, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "ip", table).Run() })
	return func(src string) int {
		t.Helper()
		out, err := exec.Command("nft", "-j", "list", "table", "ip", table).Output()
		if err != nil {
			t.Fatalf("nft list table %s: %v", table, err)
		}
		var doc struct {
			Nftables []struct {
				Rule *struct {
					Comment string           `json:"comment"`
					Expr    []map[string]any `json:"expr"`
				} `json:"rule"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("nft -j list table %s: %v", table, err)
		}
		for _, o := range doc.Nftables {
			if o.Rule == nil || o.Rule.Comment != src {
				continue
			}
			for _, e := range o.Rule.Expr {
				if c, ok := e["counter"].(map[string]any); ok {
					n, _ := c["packets"].(float64)
					return int(n)
				}
			}
		}
		t.Fatalf("no counter for %s in table %s", src, table)
		return 0
	}
}

// metaStandIn is an address that stands in for a cloud's metadata service
// (link-local, as 169.254.169.254 is): routed into a namespace the test
// owns on the cluster's bridge, so a probe of it never leaves the machine.
var metaStandIn = netip.MustParseAddr("169.254.77.78")

// bridgeOf names the link that holds address ip: the cluster's bridge for
// the node's address.
func bridgeOf(t *testing.T, ip string) string {
	t.Helper()
	want := net.ParseIP(ip)
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if a.IP.Equal(want) {
				return l.Attrs().Name
			}
		}
	}
	t.Fatalf("no link holds %s", ip)
	return ""
}

// The base's deny-all NetworkPolicy, enforced by the test cluster's
// kube-router, cuts a networked pod in its namespace off, whether runc's
// or gVisor's own network stack sends: it reaches neither a listener the
// test owns on the node, nor the kubelet's port, nor a DNS server on the
// node, nor the API server's Service, nor a metadata stand-in, nor a pod
// elsewhere, and no pod reaches it. Each is witnessed by a listener or a
// counter of the test's. The same probes from a namespace without the
// policy get through, so each refusal is the policy's doing.
func TestSandboxNetworkPolicyOnCluster(t *testing.T) {
	cs, rc := needCluster(t)
	ctx := context.Background()
	fenced, open := testNamespace(t, cs), testNamespace(t, cs)
	applyPolicy(t, cs, fenced)
	fencedIP, openIP := serverPod(t, cs, fenced, "server", ""), serverPod(t, cs, open, "server", "")
	fencedGV, openGV := serverPod(t, cs, fenced, "gvisor", netRuntimeClass), serverPod(t, cs, open, "gvisor", netRuntimeClass)
	fencedIPs, openIPs := []string{fencedIP, fencedGV}, []string{openIP, openGV}

	po, err := cs.CoreV1().Pods(fenced).Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, po.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeIP := nodeAddress(t, cs, node.Name)
	kubeletPort := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	api, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln := netnstest.ListenTCP(t, "", net.JoinHostPort(nodeIP, "0"))
	kubelet := inputCounter(t, kubeletPort, append(fencedIPs, openIPs...)...)
	// A DNS server on the node, as a node-local cache would be; there is
	// no cluster DNS here to stand in for otherwise.
	dns := netnstest.ListenUDP(t, "", net.JoinHostPort(nodeIP, "53"))
	meta := netnstest.StandIn{Dir: "/run/netns", Addr: metaStandIn, Port: 80,
		Bridge: bridgeOf(t, nodeIP), Gateway: netip.MustParseAddr(nodeIP)}.Start(t)

	// An enforcer programs a new pod's rules a moment after it has its
	// address: wait for the first refusal, then hold it to every probe.
	for _, pod := range []string{"server", "gvisor"} {
		waitFor(t, time.Minute, "the policy enforced for "+fenced+"/"+pod, func() (bool, error) {
			return !connects(t, rc, cs, fenced, pod, nodeIP, ln.Port()), nil
		})
	}
	reachedBefore := map[string]int64{fencedIP: ln.From(fencedIP), fencedGV: ln.From(fencedGV)}

	type probe struct {
		name          string
		ns, pod, host string
		port          int
	}
	var blocked []probe
	for _, p := range []struct{ pod, what string }{{"server", "pod"}, {"gvisor", "gVisor pod"}} {
		blocked = append(blocked,
			probe{"fenced " + p.what + " to the node's listener", fenced, p.pod, nodeIP, ln.Port()},
			probe{"fenced " + p.what + " to the kubelet's port", fenced, p.pod, nodeIP, kubeletPort},
			probe{"fenced " + p.what + " to the API server's service", fenced, p.pod, api.Spec.ClusterIP, 443},
			probe{"fenced " + p.what + " to the metadata stand-in", fenced, p.pod, metaStandIn.String(), meta.Port()},
			probe{"fenced " + p.what + " to a pod in another namespace", fenced, p.pod, openIP, 8080},
		)
	}
	blocked = append(blocked,
		probe{"pod in another namespace to the fenced pod", open, "server", fencedIP, 8080},
		probe{"pod in another namespace to the fenced gVisor pod", open, "server", fencedGV, 8080})
	for _, c := range blocked {
		t.Run(c.name, func(t *testing.T) {
			if connects(t, rc, cs, c.ns, c.pod, c.host, c.port) {
				t.Error("connected; want blocked")
			}
		})
	}
	for _, pod := range []string{"server", "gvisor"} {
		sendsUDP(t, rc, cs, fenced, pod, nodeIP, dns.Port())
	}

	// The controls: the same targets from outside the policy, and each
	// fenced server seen up from inside its own pod.
	var controls []probe
	for _, p := range []struct{ pod, what string }{{"server", "pod"}, {"gvisor", "gVisor pod"}} {
		controls = append(controls,
			probe{"open " + p.what + " to the node's listener", open, p.pod, nodeIP, ln.Port()},
			probe{"open " + p.what + " to the kubelet's port", open, p.pod, nodeIP, kubeletPort},
			probe{"open " + p.what + " to the metadata stand-in", open, p.pod, metaStandIn.String(), meta.Port()},
		)
	}
	controls = append(controls,
		probe{"open pod to the API server's service", open, "server", api.Spec.ClusterIP, 443},
		probe{"open gVisor pod to the open pod", open, "gvisor", openIP, 8080},
		probe{"fenced pod to its own address", fenced, "server", fencedIP, 8080},
		probe{"fenced gVisor pod to its own address", fenced, "gvisor", fencedGV, 8080})
	for _, c := range controls {
		t.Run(c.name, func(t *testing.T) {
			if !connects(t, rc, cs, c.ns, c.pod, c.host, c.port) {
				t.Error("blocked; want connected")
			}
		})
	}
	// The open pods' datagrams went out after the fenced pods' did, on the
	// same path: once they have arrived, the fenced ones never will.
	for _, ip := range openIPs {
		pod := map[string]string{openIP: "server", openGV: "gvisor"}[ip]
		waitFor(t, 30*time.Second, "the DNS listener hearing open pod "+ip, func() (bool, error) {
			sendsUDP(t, rc, cs, open, pod, nodeIP, dns.Port())
			return dns.From(ip) > 0, nil
		})
	}

	for _, ip := range fencedIPs {
		if n := ln.From(ip) - reachedBefore[ip]; n != 0 {
			t.Errorf("the node's listener accepted %d connections from fenced pod %s once the policy held", n, ip)
		}
		if n := kubelet(ip); n != 0 {
			t.Errorf("%d packets from fenced pod %s reached the kubelet's port %d", n, ip, kubeletPort)
		}
		if n := dns.From(ip); n != 0 {
			t.Errorf("the node's DNS listener got %d datagrams from fenced pod %s", n, ip)
		}
		if n := meta.From(ip); n != 0 {
			t.Errorf("the metadata stand-in accepted %d connections from fenced pod %s", n, ip)
		}
	}
	for _, ip := range openIPs {
		if ln.From(ip) == 0 || kubelet(ip) == 0 || meta.From(ip) == 0 {
			t.Errorf("open pod %s: node's listener %d, kubelet's port %d packets, metadata stand-in %d; a control that saw nothing proves nothing",
				ip, ln.From(ip), kubelet(ip), meta.From(ip))
		}
	}
}
