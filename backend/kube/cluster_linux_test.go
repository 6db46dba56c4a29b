package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
)

// testKubeconfig is the admin kubeconfig of the cluster scripts/cluster.sh
// starts; AIRLOCK_KUBECONFIG names another.
func testKubeconfig() string {
	if p := os.Getenv("AIRLOCK_KUBECONFIG"); p != "" {
		return p
	}
	return "/var/lib/airlock-k8s/admin.conf"
}

// testImage is the sandbox image cluster.sh imported into the cluster.
const testImage = "airlock.local/sandbox:bookworm"

// needCluster connects to the test cluster, or skips (fails under CI=true)
// when there is none.
func needCluster(t *testing.T) (*kubernetes.Clientset, *rest.Config) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", testKubeconfig())
	if err == nil {
		var cs *kubernetes.Clientset
		if cs, err = kubernetes.NewForConfig(cfg); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err = cs.Discovery().ServerVersion(); err == nil {
				_, err = cs.NodeV1().RuntimeClasses().Get(ctx, "gvisor", metav1.GetOptions{})
			}
			if err == nil {
				return cs, cfg
			}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no test cluster under CI=true: %v (run scripts/install-k8s.sh and scripts/cluster.sh up)", err)
	}
	t.Skipf("no test cluster: %v (scripts/cluster.sh up starts one)", err)
	return nil, nil
}

// testNamespace makes a namespace of the test's own and deletes it, and
// waits for it to be gone, when the test ends.
func testNamespace(t *testing.T, cs *kubernetes.Clientset) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "airlock-test-" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods are refused until the namespace's default service account exists.
	waitFor(t, time.Minute, "the default service account of "+name, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	t.Cleanup(func() {
		zero := int64(0)
		_ = cs.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", name, err)
		}
		waitFor(t, 2*time.Minute, "namespace "+name+" gone", func() (bool, error) {
			_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	return name
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// execIn runs cmd in the pod's sandbox container over the API server's
// streaming, WebSocket first with SPDY as the fallback.
func execIn(cfg *rest.Config, cs *kubernetes.Clientset, ns, pod string, cmd ...string) (string, string, error) {
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: Container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return "", "", err
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, httpstream.IsUpgradeFailure)
	if err != nil {
		return "", "", err
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	return stdout.String(), stderr.String(), err
}

// A sandbox pod, created on a real cluster and read back from the API
// server, is what Pod built: the server dropped or changed none of the
// fields the baseline rests on. It runs under gVisor, as the unprivileged
// user's driver, with a read-only root.
func TestPodOnCluster(t *testing.T) {
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	p := policy()
	p.Namespace, p.Name, p.Image = ns, "airlock-readback", testImage
	p.NodeSelector, p.Tolerations, p.SchedulerName = nil, nil, ""
	want, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, want, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ws, gs := want.Spec, got.Spec
	wc, gc := ws.Containers[0], gs.Containers[0]
	same := []struct {
		what      string
		want, got any
	}{
		{"runtimeClassName", ws.RuntimeClassName, gs.RuntimeClassName},
		{"activeDeadlineSeconds", ws.ActiveDeadlineSeconds, gs.ActiveDeadlineSeconds},
		{"automountServiceAccountToken", ws.AutomountServiceAccountToken, gs.AutomountServiceAccountToken},
		{"enableServiceLinks", ws.EnableServiceLinks, gs.EnableServiceLinks},
		{"host namespaces", []bool{ws.HostNetwork, ws.HostPID, ws.HostIPC}, []bool{gs.HostNetwork, gs.HostPID, gs.HostIPC}},
		{"dns", []any{ws.DNSPolicy, ws.DNSConfig}, []any{gs.DNSPolicy, gs.DNSConfig}},
		{"pod securityContext", ws.SecurityContext, gs.SecurityContext},
		{"volumes", ws.Volumes, gs.Volumes},
		{"container securityContext", wc.SecurityContext, gc.SecurityContext},
		{"command", wc.Command, gc.Command},
		{"env", wc.Env, gc.Env},
		{"resources", wc.Resources, gc.Resources},
		{"mounts", wc.VolumeMounts, gc.VolumeMounts},
		{"stdin", []bool{wc.Stdin, wc.StdinOnce, wc.TTY}, []bool{gc.Stdin, gc.StdinOnce, gc.TTY}},
		{"image and pull policy", []any{wc.Image, wc.ImagePullPolicy}, []any{gc.Image, gc.ImagePullPolicy}},
		{"init and ephemeral containers", 0, len(gs.InitContainers) + len(gs.EphemeralContainers)},
		{"containers", 1, len(gs.Containers)},
	}
	for _, s := range same {
		if !equality.Semantic.DeepEqual(s.want, s.got) {
			t.Errorf("%s: sent %+v, the API server holds %+v", s.what, s.want, s.got)
		}
	}
	if got.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Errorf("QoS class %q, want Guaranteed (requests = limits)", got.Status.QOSClass)
	}

	waitFor(t, 2*time.Minute, "the pod running", func() (bool, error) {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return false, errors.New("the pod ended: " + pod.Status.Message)
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	})
	checks := []struct {
		cmd  []string
		want func(out string) bool
		what string
	}{
		{[]string{"uname", "-r"}, func(o string) bool { return strings.Contains(o, "gvisor") }, "gVisor's kernel"},
		{[]string{"sh", "-c", "touch /root-write 2>&1; echo $?"}, func(o string) bool { return strings.TrimSpace(lastLine(o)) != "0" }, "a read-only root"},
		{[]string{"sh", "-c", "df -k /workspace | tail -1"}, func(o string) bool { return strings.Contains(o, "102400") }, "a 100 MiB /workspace"},
		{[]string{"cat", "/etc/resolv.conf"}, func(o string) bool { return strings.Contains(o, "nameserver 127.0.0.1") }, "a loopback nameserver only"},
		// runsc's network "none": gVisor shows loopback and nothing else.
		{[]string{"sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}, func(o string) bool { return strings.TrimSpace(o) == "lo" }, "loopback as the only interface"},
	}
	for _, c := range checks {
		out, errOut, err := execIn(cfg, cs, ns, p.Name, c.cmd...)
		if err != nil || !c.want(out) {
			t.Errorf("%v: %q %q %v; want %s", c.cmd, out, errOut, err, c.what)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
