package kube

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// Container is the name of a sandbox pod's only container.
const Container = "sandbox"

// annotationPrefix is the only prefix a sandbox pod's annotations have.
const annotationPrefix = "airlock.dev/"

// PodPolicy is everything the pod of one sandbox is built from: the same
// policy the local backend builds its OCI spec from, plus where the pod
// may be placed.
type PodPolicy struct {
	Name, Namespace string
	Labels          map[string]string
	// Annotations carry a session's record (owner, idle deadline).
	Annotations map[string]string
	// Owner, when set, owns the pod: the instance Lease, whose deletion
	// lets the garbage collector remove the pod.
	Owner metav1.OwnerReference
	// Image is the sandbox image, already on every node that may run it
	// (pulled never).
	Image string
	// RuntimeClass names the RuntimeClass whose handler is gVisor.
	RuntimeClass string
	// AwaitFence makes the driver wait, before any work, until the pod
	// cannot reach the API server: its NetworkPolicy is in force
	// (networked pods).
	AwaitFence bool
	// EgressProxy is a networked pod's egress proxy (IP:port): its driver
	// waits, at the first attach, until it can reach it.
	EgressProxy string
	// EgressRelay, when set, is the address inside the pod where the
	// driver relays connections to EgressProxy, and to whichever proxy a
	// later holder names: a networked session's pods, which outlive the
	// replica that made them.
	EgressRelay string
	// UID and GID are the code's user; the driver starts the code as them.
	UID, GID uint32
	// Preload starts the driver's warm Python worker (warm pods),
	// importing PreloadModules.
	Preload        bool
	PreloadModules []string
	// Env is the whole environment as KEY=VALUE lines (runtime.BuildEnv).
	Env    []string
	Limits runtime.Limits
	// Deadline is the pod's activeDeadlineSeconds: a backstop that ends
	// the pod should airlock lose track of it.
	DeadlineSeconds int64
	NodeSelector    map[string]string
	Tolerations     []corev1.Toleration
	SchedulerName   string
	// Session pods keep their stdin open across attaches, so another
	// airlock can serve a session's next call; a one-run pod's stdin closes
	// when its one attach ends, and its driver exits.
	Session bool
}

// Pod builds the pod of a sandbox from its policy. It is a pure function,
// so the security baseline can be checked without a cluster: gVisor by
// RuntimeClass; read-only root; memory-backed, size-capped /workspace, /tmp
// and code directory; the driver as the only process with capabilities,
// and only those it needs to start the code as the unprivileged user; no
// privilege escalation; the runtime's default seccomp profile; no service
// account token, service links, host namespaces or host paths; no DNS
// server (a nameserver on the sandbox's own loopback, where nothing
// answers); requests equal to limits.
func Pod(p PodPolicy) (*corev1.Pod, error) {
	if err := runtime.CheckSandbox(p.UID, p.GID, p.Limits); err != nil {
		return nil, fmt.Errorf("pod spec: %w", err)
	}
	l := p.Limits
	switch {
	case p.Name == "" || p.Namespace == "":
		return nil, fmt.Errorf("pod spec: name and namespace are required")
	case p.Image == "":
		return nil, fmt.Errorf("pod spec: no image (kubernetes.image)")
	case p.RuntimeClass == "":
		return nil, fmt.Errorf("pod spec: no runtime class (kubernetes.runtime_class): a sandbox pod runs under gVisor or not at all")
	case p.DeadlineSeconds <= 0:
		return nil, fmt.Errorf("pod spec: the deadline must be positive")
	}
	env := make([]corev1.EnvVar, 0, len(p.Env))
	for _, kv := range p.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("pod spec: environment entry %q is not KEY=VALUE", kv)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	// Kubernetes spells capabilities without the CAP_ prefix.
	add := make([]corev1.Capability, 0, len(runtime.DriverCapabilities))
	for _, c := range runtime.DriverCapabilities {
		add = append(add, corev1.Capability(strings.TrimPrefix(c, "CAP_")))
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(l.CPUs*1000), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(l.MemoryBytes, resource.BinarySI),
	}
	memoryDir := func(name string, size int64) corev1.Volume {
		q := resource.NewQuantity(size, resource.BinarySI)
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: q},
		}}
	}
	root, no := int64(0), false
	yes := true
	grace := int64(0)
	deadline := p.DeadlineSeconds
	labels := make(map[string]string, len(p.Labels))
	for k, v := range p.Labels {
		labels[k] = v
	}
	nodeSelector := make(map[string]string, len(p.NodeSelector))
	for k, v := range p.NodeSelector {
		nodeSelector[k] = v
	}
	var annotations map[string]string
	if len(p.Annotations) > 0 {
		annotations = make(map[string]string, len(p.Annotations))
		for k, v := range p.Annotations {
			// Only airlock's own keys: a node's containerd may pass pod
			// annotations on to runsc, which honours dev.gvisor.flag.*
			// even without --allow-flag-override.
			if !strings.HasPrefix(k, annotationPrefix) {
				return nil, fmt.Errorf("pod spec: annotation %q is not airlock's (%s*)", k, annotationPrefix)
			}
			annotations[k] = v
		}
	}
	var owners []metav1.OwnerReference
	if p.Owner.UID != "" {
		owners = []metav1.OwnerReference{p.Owner}
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: labels, Annotations: annotations, OwnerReferences: owners},
		Spec: corev1.PodSpec{
			RuntimeClassName:              &p.RuntimeClass,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			ActiveDeadlineSeconds:         &deadline,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         &no,
			Hostname:                      "sandbox",
			// The API wants a nameserver with dnsPolicy None; loopback
			// inside the sandbox has nothing listening.
			DNSPolicy:     corev1.DNSNone,
			DNSConfig:     &corev1.PodDNSConfig{Nameservers: []string{"127.0.0.1"}},
			NodeSelector:  nodeSelector,
			Tolerations:   append([]corev1.Toleration(nil), p.Tolerations...),
			SchedulerName: p.SchedulerName,
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: []corev1.Volume{
				memoryDir("workspace", l.WorkspaceBytes),
				memoryDir("tmp", l.TmpBytes),
				memoryDir("code", runtime.CodeDirBytes),
			},
			Containers: []corev1.Container{{
				Name:            Container,
				Image:           p.Image,
				ImagePullPolicy: corev1.PullNever,
				Command:         Command(p),
				Env:             env,
				WorkingDir:      driver.Workspace,
				// The driver reads its framed protocol on stdin.
				Stdin:     true,
				StdinOnce: !p.Session,
				Resources: corev1.ResourceRequirements{Requests: resources, Limits: resources.DeepCopy()},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "workspace", MountPath: driver.Workspace},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "code", MountPath: driver.CodeDir},
				},
				SecurityContext: &corev1.SecurityContext{
					// The driver is root inside gVisor's kernel, never on
					// the node, and holds only what it needs to start the
					// code as p.UID with no capabilities: SETUID and SETGID
					// to change user, SETPCAP to empty the bounding set
					// first, KILL to end the code's processes (another
					// user's) when the run ends.
					RunAsUser:                &root,
					RunAsGroup:               &root,
					RunAsNonRoot:             &no,
					Privileged:               &no,
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: add},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				StartupProbe:             startupProbe(p),
			}},
			// Sandboxes spread over the nodes that may take them.
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
				MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
			}},
		},
	}
	return pod, nil
}

// ReadyFile is where a warm pod's driver says its preload is done; the
// pod's startup probe looks for it, so the pod turns Ready only then.
const ReadyFile = driver.CodeDir + "/ready"

// startupProbe makes a warm pod Ready only once its driver has preloaded;
// a cold pod has none (airlock attaches as soon as it runs).
func startupProbe(p PodPolicy) *corev1.Probe {
	if !p.Preload {
		return nil
	}
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/bin/test", "-e", ReadyFile}}},
		PeriodSeconds: 1, FailureThreshold: 180, TimeoutSeconds: 5,
	}
}

// NoFile is the open-file limit of a sandbox pod, as of a local sandbox.
const NoFile = 1024

// Command is the driver's command line in a pod: the local one, plus what
// a pod spec cannot say. The driver says hello only once airlock has
// attached (output written before is lost to the attacher), and sets the
// process and open-file limits itself (Kubernetes sets no rlimits; gVisor
// enforces RLIMIT_NPROC for the code's user).
func Command(p PodPolicy) []string {
	args := append(runtime.DriverArgs(p.UID, p.GID, p.Preload, p.PreloadModules),
		"--hello-on-attach", "--nproc", strconv.FormatInt(p.Limits.Pids, 10), "--nofile", strconv.Itoa(NoFile))
	if p.Preload {
		args = append(args, "--ready-file", ReadyFile)
	}
	if p.AwaitFence {
		args = append(args, "--await-fence")
	}
	if p.EgressProxy != "" {
		args = append(args, "--egress-proxy", p.EgressProxy)
	}
	if p.EgressRelay != "" {
		args = append(args, "--egress-relay", p.EgressRelay)
	}
	return args
}
