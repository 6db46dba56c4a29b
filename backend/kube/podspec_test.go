package kube

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

func policy() PodPolicy {
	return PodPolicy{
		Name: "airlock-abc", Namespace: "sandboxes",
		Labels:       map[string]string{"airlock.instance": "i1"},
		Image:        "airlock.local/sandbox:bookworm",
		RuntimeClass: "gvisor",
		UID:          1000, GID: 1000,
		Env: runtime.BuildEnv(),
		Limits: runtime.Limits{
			Timeout: 30 * time.Second, MemoryBytes: 512 << 20, CPUs: 1.5, Pids: 64,
			StdoutBytes: 1 << 20, StderrBytes: 1 << 20, WorkspaceBytes: 100 << 20, TmpBytes: 50 << 20,
		},
		DeadlineSeconds: 90,
		NodeSelector:    map[string]string{"sandbox": "yes"},
		Tolerations:     []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		SchedulerName:   "sandbox-scheduler",
	}
}

// Every field the security baseline rests on, read from the built pod.
func TestPodBaseline(t *testing.T) {
	pod, err := Pod(policy())
	if err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	f := false
	checks := []struct {
		what string
		ok   bool
	}{
		{"runtimeClassName gvisor", s.RuntimeClassName != nil && *s.RuntimeClassName == "gvisor"},
		{"restartPolicy Never", s.RestartPolicy == corev1.RestartPolicyNever},
		{"activeDeadlineSeconds", s.ActiveDeadlineSeconds != nil && *s.ActiveDeadlineSeconds == 90},
		{"no service account token", s.AutomountServiceAccountToken != nil && !*s.AutomountServiceAccountToken},
		{"no service links", s.EnableServiceLinks != nil && !*s.EnableServiceLinks},
		{"no host namespaces", !s.HostNetwork && !s.HostPID && !s.HostIPC && s.HostUsers == nil},
		{"no shared process namespace", reflect.DeepEqual(s.ShareProcessNamespace, &f)},
		{"dnsPolicy None, loopback nameserver only", s.DNSPolicy == corev1.DNSNone && s.DNSConfig != nil &&
			reflect.DeepEqual(s.DNSConfig.Nameservers, []string{"127.0.0.1"}) && len(s.DNSConfig.Searches) == 0},
		{"pod seccomp RuntimeDefault", s.SecurityContext != nil && s.SecurityContext.SeccompProfile != nil &&
			s.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no init or ephemeral containers", len(s.InitContainers) == 0 && len(s.EphemeralContainers) == 0},
		{"one container", len(s.Containers) == 1},
		{"placement", reflect.DeepEqual(s.NodeSelector, map[string]string{"sandbox": "yes"}) &&
			len(s.Tolerations) == 1 && s.SchedulerName == "sandbox-scheduler"},
		{"labels", pod.Labels["airlock.instance"] == "i1" && pod.Namespace == "sandboxes" && pod.Name == "airlock-abc"},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not so in %+v", c.what, s)
		}
	}
	for _, v := range s.Volumes {
		if v.HostPath != nil || v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory || v.EmptyDir.SizeLimit == nil {
			t.Errorf("volume %s is not a capped memory-backed emptyDir: %+v", v.Name, v.VolumeSource)
		}
	}
	sizes := map[string]int64{}
	for _, v := range s.Volumes {
		sizes[v.Name] = v.EmptyDir.SizeLimit.Value()
	}
	if want := map[string]int64{"workspace": 100 << 20, "tmp": 50 << 20, "code": runtime.CodeDirBytes}; !reflect.DeepEqual(sizes, want) {
		t.Errorf("volume sizes %v, want %v", sizes, want)
	}

	c := s.Containers[0]
	sc := c.SecurityContext
	var add []string
	for _, a := range sc.Capabilities.Add {
		add = append(add, "CAP_"+string(a))
	}
	cchecks := []struct {
		what string
		ok   bool
	}{
		{"image never pulled", c.Image == "airlock.local/sandbox:bookworm" && c.ImagePullPolicy == corev1.PullNever},
		{"driver as the command", reflect.DeepEqual(c.Command, append(runtime.DriverArgs(1000, 1000, false, nil), "--hello-on-attach", "--nproc", "64", "--nofile", "1024")) && len(c.Args) == 0},
		{"driver runs as root in gVisor", sc.RunAsUser != nil && *sc.RunAsUser == 0 && sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot},
		{"not privileged", sc.Privileged != nil && !*sc.Privileged},
		{"no privilege escalation", sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation},
		{"read-only root", sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem},
		{"every capability dropped", reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"})},
		{"only the driver's capabilities added", reflect.DeepEqual(add, runtime.DriverCapabilities)},
		{"container seccomp RuntimeDefault", sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no proc mount unmasking", sc.ProcMount == nil},
		{"stdin open for the driver, once", c.Stdin && c.StdinOnce && !c.TTY},
		{"working dir", c.WorkingDir == driver.Workspace},
		{"no ports, probes or envFrom", len(c.Ports) == 0 && c.LivenessProbe == nil && c.ReadinessProbe == nil && len(c.EnvFrom) == 0},
		{"requests equal limits", reflect.DeepEqual(c.Resources.Requests, c.Resources.Limits)},
		{"cpu 1.5", c.Resources.Limits.Cpu().MilliValue() == 1500},
		{"memory 512 MiB", c.Resources.Limits.Memory().Value() == 512<<20},
	}
	for _, cc := range cchecks {
		if !cc.ok {
			t.Errorf("container %s: not so in %+v", cc.what, c)
		}
	}
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			t.Errorf("env %s comes from elsewhere", e.Name)
		}
		env = append(env, e.Name+"="+e.Value)
	}
	if !reflect.DeepEqual(env, runtime.BuildEnv()) {
		t.Errorf("env %v, want exactly the allow-list %v", env, runtime.BuildEnv())
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if want := map[string]string{"/workspace": "workspace", "/tmp": "tmp", driver.CodeDir: "code"}; !reflect.DeepEqual(mounts, want) {
		t.Errorf("mounts %v, want %v", mounts, want)
	}
}

// A warm pod preloads, says when it has, and is Ready only then.
func TestPodWarm(t *testing.T) {
	p := policy()
	p.Preload, p.PreloadModules = true, []string{"numpy"}
	pod, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	want := append(runtime.DriverArgs(1000, 1000, true, []string{"numpy"}), "--hello-on-attach", "--nproc", "64", "--nofile", "1024", "--ready-file", ReadyFile)
	if !reflect.DeepEqual(c.Command, want) {
		t.Errorf("command %v, want %v", c.Command, want)
	}
	if c.StartupProbe == nil || c.StartupProbe.Exec == nil || !reflect.DeepEqual(c.StartupProbe.Exec.Command, []string{"/usr/bin/test", "-e", ReadyFile}) {
		t.Errorf("startup probe %+v; want one that waits for the ready file", c.StartupProbe)
	}
	cold, _ := Pod(policy())
	if cold.Spec.Containers[0].StartupProbe != nil {
		t.Error("a cold pod has a startup probe: nothing waits for it")
	}
}

func TestPodSessionKeepsStdin(t *testing.T) {
	p := policy()
	p.Session, p.Preload, p.PreloadModules = true, true, []string{"numpy"}
	pod, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if !c.Stdin || c.StdinOnce {
		t.Errorf("session pod stdin %v once %v; want open across attaches", c.Stdin, c.StdinOnce)
	}
	if !reflect.DeepEqual(c.Command[:len(c.Command)-7], runtime.DriverArgs(1000, 1000, true, []string{"numpy"})) {
		t.Errorf("command %v", c.Command)
	}
}

// The policy's maps and slices are copied: a later change to them does not
// reach a built pod.
func TestPodCopiesItsInputs(t *testing.T) {
	p := policy()
	pod, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["airlock.instance"] = "changed"
	p.NodeSelector["sandbox"] = "changed"
	p.Tolerations[0].Key = "changed"
	if pod.Labels["airlock.instance"] != "i1" || pod.Spec.NodeSelector["sandbox"] != "yes" || pod.Spec.Tolerations[0].Key != "sandbox" {
		t.Errorf("the pod shares memory with its policy: %+v", pod)
	}
}

func TestPodRefusals(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*PodPolicy)
		want string
	}{
		{"root uid", func(p *PodPolicy) { p.UID = 0 }, "root"},
		{"root gid", func(p *PodPolicy) { p.GID = 0 }, "root"},
		{"no memory limit", func(p *PodPolicy) { p.Limits.MemoryBytes = 0 }, "limit"},
		{"no cpu limit", func(p *PodPolicy) { p.Limits.CPUs = 0 }, "limit"},
		{"no tmp cap", func(p *PodPolicy) { p.Limits.TmpBytes = 0 }, "limit"},
		{"no runtime class", func(p *PodPolicy) { p.RuntimeClass = "" }, "kubernetes.runtime_class"},
		{"no image", func(p *PodPolicy) { p.Image = "" }, "kubernetes.image"},
		{"no name", func(p *PodPolicy) { p.Name = "" }, "name"},
		{"no deadline", func(p *PodPolicy) { p.DeadlineSeconds = 0 }, "deadline"},
		{"bad env", func(p *PodPolicy) { p.Env = []string{"NOEQUALS"} }, "KEY=VALUE"},
		{"a runsc flag as annotation", func(p *PodPolicy) {
			p.Annotations = map[string]string{annOwner: "alice", "dev.gvisor.flag.host-uds": "all"}
		}, "dev.gvisor.flag.host-uds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := policy()
			c.mut(&p)
			pod, err := Pod(p)
			if err == nil || !strings.Contains(err.Error(), c.want) || pod != nil {
				t.Errorf("Pod = %v, %v; want an error naming %q", pod, err, c.want)
			}
		})
	}
}

// A networked pod's driver waits for its NetworkPolicy before any work;
// no other pod's does.
func TestPodAwaitsFence(t *testing.T) {
	p := policy()
	p.AwaitFence = true
	pod, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	want := append(runtime.DriverArgs(1000, 1000, false, nil), "--hello-on-attach", "--nproc", "64", "--nofile", "1024", "--await-fence")
	if got := pod.Spec.Containers[0].Command; !reflect.DeepEqual(got, want) {
		t.Errorf("command %v, want %v", got, want)
	}
	cold, _ := Pod(policy())
	if slices.Contains(cold.Spec.Containers[0].Command, "--await-fence") {
		t.Error("a pod without a network waits for a fence")
	}
}

// A networked session's driver relays its proxy from the pod's loopback,
// starting with the proxy it was given; no other pod's does.
func TestPodEgressRelay(t *testing.T) {
	p := policy()
	p.AwaitFence = true
	p.EgressRelay, p.EgressProxy = SessionRelay, "10.0.0.7:3128"
	pod, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	want := append(runtime.DriverArgs(1000, 1000, false, nil), "--hello-on-attach", "--nproc", "64", "--nofile", "1024", "--await-fence",
		"--egress-proxy", "10.0.0.7:3128", "--egress-relay", "127.0.0.1:3128")
	if got := pod.Spec.Containers[0].Command; !reflect.DeepEqual(got, want) {
		t.Errorf("command %v, want %v", got, want)
	}
	plain, _ := Pod(policy())
	if slices.Contains(plain.Spec.Containers[0].Command, "--egress-relay") {
		t.Error("a pod without a session's network relays")
	}
}
