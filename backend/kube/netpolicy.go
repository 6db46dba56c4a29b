package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/checks"
)

// LabelCanary marks the doctor's NetworkPolicy canary pod. It carries no
// managed-by label, so no replica's pool or sweeper ever takes it for a
// sandbox.
const LabelCanary = "airlock.dev/netpol-canary"

// Exit codes of canaryScript.
const (
	canaryBlocked   = 0 // a connection failed: something drops or refuses it
	canaryReached   = 3 // every attempt for canaryFor connected
	canaryNoNetwork = 4 // the pod has no interface but lo: nothing to test
)

// canaryFor is how long the canary keeps connecting before it says the
// API server was reachable: an enforcer programs a new pod's rules a
// moment after the pod has its address, and the first attempts may pass.
const canaryFor = 10 * time.Second

// canaryScript tries the API server's Service (the one address every pod
// is told of, even with service links off) until a connection fails or
// canaryFor has passed, and leaves one line in the termination message.
var canaryScript = fmt.Sprintf(`import os, socket, sys, time
def done(code, msg):
    open("/dev/termination-log", "w").write(msg)
    sys.exit(code)
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
if ifaces == ["lo"]:
    done(%d, "no network interface but lo")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"])
end = time.monotonic() + %d
while True:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as e:
        done(%d, "could not connect to the API server's service %%s:%%d (%%s)" %% (host, port, e))
    if time.monotonic() > end:
        done(%d, "connected to the API server's service %%s:%%d for %ds" %% (host, port))
    time.sleep(0.5)
`, canaryNoNetwork, int(canaryFor.Seconds()), canaryBlocked, canaryReached, int(canaryFor.Seconds()))

// CanaryPod is the NetworkPolicy canary for namespace: the sandbox image
// under the cluster's default runtime (gVisor's handler takes the network
// away, which would hide a missing policy), unprivileged, on the nodes
// sandboxes use.
func CanaryPod(cfg config.Config, name string) *corev1.Pod {
	k := cfg.Kubernetes
	uid := int64(cfg.Sandbox.UID)
	no, yes := false, true
	grace, deadline := int64(0), int64(2*canaryFor/time.Second+30)
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}
	nodeSelector := make(map[string]string, len(k.NodeSelector))
	for key, v := range k.NodeSelector {
		nodeSelector[key] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.Namespace,
			Labels: map[string]string{LabelCanary: "true", "app.kubernetes.io/part-of": "airlock"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			ActiveDeadlineSeconds:         &deadline,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			NodeSelector:                  nodeSelector,
			Tolerations:                   tolerations(k),
			SchedulerName:                 k.SchedulerName,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "canary",
				Image:           k.SandboxImage(cfg.Image),
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"python3", "-c", canaryScript},
				Resources:       corev1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// runCanary runs pod to its end and returns its container's end; a
// non-nil error says why there is none (not checked).
func runCanary(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) (*corev1.ContainerStateTerminated, error) {
	pods := cs.CoreV1().Pods(pod.Namespace)
	po, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the canary pod: %w", err)
	}
	defer func() {
		zero := int64(0)
		_ = pods.Delete(context.WithoutCancel(ctx), po.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}()
	wctx, cancel := context.WithTimeout(ctx, 2*canaryFor+60*time.Second)
	defer cancel()
	for {
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("the canary pod %s did not finish (phase %s): is the sandbox image on the nodes, and may the pod run there?", po.Name, po.Status.Phase)
		case <-time.After(500 * time.Millisecond):
		}
		if po, err = pods.Get(wctx, po.Name, metav1.GetOptions{}); err != nil {
			return nil, err
		}
		for _, s := range po.Status.ContainerStatuses {
			if s.State.Terminated != nil {
				return s.State.Terminated, nil
			}
		}
	}
}

// canaryName is a new canary pod's name.
func canaryName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "airlock-netpol-canary-" + hex.EncodeToString(b)
}

// policyCanary runs CanaryPod and reads its verdict. A pod that reaches
// the API server means nothing enforces a deny-all policy in the sandbox
// namespace: a warning, not a failure, while gVisor's handler keeps
// sandboxes off the network on its own.
func policyCanary(ctx context.Context, cs kubernetes.Interface, cfg config.Config) checks.Check {
	k := cfg.Kubernetes
	const name = "network policy"
	fix := "apply a deny-all NetworkPolicy to " + k.Namespace + " (deploy/kubernetes/networkpolicy.yaml) and enforce it (a CNI that enforces NetworkPolicy, or kube-router's policy controller); until then sandboxes rely on the handler's network \"none\" alone"
	term, err := runCanary(ctx, cs, CanaryPod(cfg, canaryName()))
	if err != nil {
		return checks.Check{Name: name, Warn: true, Detail: "not checked: " + err.Error(), Fix: fix}
	}
	switch term.ExitCode {
	case canaryBlocked:
		return checks.Check{Name: name, OK: true, Detail: "enforced in " + k.Namespace + ": a canary pod " + term.Message}
	case canaryReached:
		return checks.Check{Name: name, Warn: true, Detail: "NOT enforced in " + k.Namespace + ": a canary pod " + term.Message, Fix: fix}
	default:
		return checks.Check{Name: name, Warn: true, Fix: fix,
			Detail: fmt.Sprintf("not checked: the canary pod exited %d: %s", term.ExitCode, term.Message)}
	}
}

// networkCanary runs a canary as a networked sandbox pod is made (the
// network RuntimeClass, the label the egress policy selects): it must
// have a network, and the API server must be out of its reach, or every
// networked run fails (its driver waits for exactly that).
func networkCanary(ctx context.Context, cs kubernetes.Interface, cfg config.Config) checks.Check {
	k := cfg.Kubernetes
	const name = "networked"
	pod := CanaryPod(cfg, canaryName())
	pod.Spec.RuntimeClassName = &k.NetworkRuntimeClass
	pod.Labels[LabelNetwork] = "allowlist"
	term, err := runCanary(ctx, cs, pod)
	if err != nil {
		return checks.Check{Name: name, Detail: err.Error(), Fix: "kubectl describe the namespace's pods; is kubernetes.network_runtime_class a RuntimeClass the nodes have?"}
	}
	switch term.ExitCode {
	case canaryBlocked:
		return checks.Check{Name: name, OK: true, Detail: "a pod of " + k.NetworkRuntimeClass + " has a network and " + term.Message}
	case canaryReached:
		return checks.Check{Name: name, Detail: "a pod of " + k.NetworkRuntimeClass + " " + term.Message + ": networked runs will fail (their driver waits until it cannot)",
			Fix: "apply deploy/kubernetes/networkpolicy.yaml to " + k.Namespace + " and enforce NetworkPolicy"}
	case canaryNoNetwork:
		return checks.Check{Name: name, Detail: "a pod of " + k.NetworkRuntimeClass + " has " + term.Message + ": networked pods could not reach the egress proxy",
			Fix: "kubernetes.network_runtime_class must name a gVisor handler with a network (runsc's network = \"sandbox\")"}
	default:
		return checks.Check{Name: name, Detail: fmt.Sprintf("the canary pod exited %d: %s", term.ExitCode, term.Message), Fix: "see the message"}
	}
}
