package kube

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/spf13/viper"

	"github.com/airlock-mcp/airlock/config"
)

// manifestDir is the kustomize base a platform team applies.
const manifestDir = "../../deploy/kubernetes"

// decodeManifests decodes every object of a multi-document YAML stream.
func decodeManifests(t *testing.T, r io.Reader) []kruntime.Object {
	t.Helper()
	var out []kruntime.Object
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		out = append(out, obj)
	}
}

// baseObjects are the objects of the base's resource files.
func baseObjects(t *testing.T) []kruntime.Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []kruntime.Object
	for _, f := range files {
		switch filepath.Base(f) {
		case "kustomization.yaml", "config.yaml":
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeManifests(t, bytes.NewReader(b))...)
	}
	return out
}

// grants flattens RBAC rules into the Permission strings they allow.
func grants(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					p := Permission{Group: g, Verb: v}
					p.Resource, p.Subresource, _ = strings.Cut(res, "/")
					out = append(out, p.String())
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// deployment is what a rendering of the manifests should deploy: the base's
// names, or the values a chart rendering was given.
type deployment struct {
	namespace    string // airlock's own
	sandboxes    string // the sandbox pods'
	runtimeClass string
	netClass     string // kubernetes.network_runtime_class, if any
	replicas     int32
}

// baseDeployment is what the kustomize base deploys.
var baseDeployment = deployment{namespace: "airlock", sandboxes: "airlock-sandboxes", runtimeClass: "gvisor", replicas: 2}

// The base's RBAC grants exactly the backend's Permissions: the
// namespaced ones by a Role in the sandbox namespace only, the cluster
// ones by name; no wildcard, no Secret, nothing else.
func TestManifestsLeastPrivilege(t *testing.T) {
	checkLeastPrivilege(t, baseObjects(t), baseDeployment)
}

// checkLeastPrivilege checks that objs grant exactly the backend's
// Permissions: the namespaced ones by one Role, bound in want.sandboxes
// only; the cluster ones by one ClusterRole limited to want's sandbox
// namespace and RuntimeClasses by name.
func checkLeastPrivilege(t *testing.T, objs []kruntime.Object, want deployment) {
	t.Helper()
	var wantNS, wantCluster []string
	for _, p := range Permissions {
		if p.Cluster {
			wantCluster = append(wantCluster, p.String())
		} else {
			wantNS = append(wantNS, p.String())
		}
	}
	sort.Strings(wantNS)
	sort.Strings(wantCluster)
	// The names each cluster-wide resource may be read by.
	wantNames := map[string][]string{"namespaces": {want.sandboxes}, "runtimeclasses": {want.runtimeClass}}
	if want.netClass != "" {
		wantNames["runtimeclasses"] = append(wantNames["runtimeclasses"], want.netClass)
	}
	var roles, clusterRoles int
	for _, obj := range objs {
		switch o := obj.(type) {
		case *rbacv1.Role:
			roles++
			if o.Namespace != want.sandboxes {
				t.Errorf("Role %s in namespace %q; want only the sandbox namespace %q", o.Name, o.Namespace, want.sandboxes)
			}
			if got := grants(o.Rules); !slices.Equal(got, wantNS) {
				t.Errorf("Role grants %v\nwant exactly %v", got, wantNS)
			}
		case *rbacv1.ClusterRole:
			clusterRoles++
			if got := grants(o.Rules); !slices.Equal(got, wantCluster) {
				t.Errorf("ClusterRole grants %v\nwant exactly %v", got, wantCluster)
			}
			for _, r := range o.Rules {
				for _, res := range r.Resources {
					if !slices.Equal(r.ResourceNames, wantNames[res]) {
						t.Errorf("ClusterRole lets %s %q be read; want only %q", res, r.ResourceNames, wantNames[res])
					}
				}
			}
		case *rbacv1.RoleBinding:
			if o.RoleRef.Kind != "Role" {
				t.Errorf("RoleBinding %s binds a %s; want only the Role", o.Name, o.RoleRef.Kind)
			}
			if o.Namespace != want.sandboxes {
				t.Errorf("RoleBinding %s in namespace %q; want only the sandbox namespace %q", o.Name, o.Namespace, want.sandboxes)
			}
		}
	}
	if roles != 1 || clusterRoles != 1 {
		t.Errorf("%d Roles and %d ClusterRoles; want one of each", roles, clusterRoles)
	}
}

// airlock's own pod: two replicas, non-root, read-only root, no
// capabilities, probes on /healthz and /readyz, requests set, a
// disruption budget; and the config it mounts loads and picks the
// Kubernetes backend on the base's namespace and RuntimeClass.
func TestManifestsAirlockPod(t *testing.T) {
	objs := baseObjects(t)
	checkAirlockPod(t, objs, filepath.Join(manifestDir, "config.yaml"), baseDeployment)
	// The base also creates both namespaces and the RuntimeClass, which
	// the chart can be told to leave to the cluster.
	kinds := map[string]int{}
	for _, obj := range objs {
		kinds[obj.GetObjectKind().GroupVersionKind().Kind]++
	}
	if kinds["Namespace"] != 2 || kinds["RuntimeClass"] != 1 {
		t.Errorf("%d Namespaces and %d RuntimeClasses in the base; want 2 and 1", kinds["Namespace"], kinds["RuntimeClass"])
	}
}

// checkAirlockPod checks airlock's pod in objs and the config at cfgPath
// that it mounts: want.replicas replicas, non-root, read-only root, no
// capabilities, probes, requests, a disruption budget; the config loads,
// names files in the pod's mounts and picks the Kubernetes backend on
// want's sandbox namespace and RuntimeClass. A RuntimeClass in objs must
// run runsc; one left out (a cluster that has it) is not checked.
func checkAirlockPod(t *testing.T, objs []kruntime.Object, cfgPath string, want deployment) {
	t.Helper()
	var dep *appsv1.Deployment
	kinds := map[string]bool{}
	for _, obj := range objs {
		kinds[obj.GetObjectKind().GroupVersionKind().Kind] = true
		switch o := obj.(type) {
		case *appsv1.Deployment:
			dep = o
		case *corev1.Namespace:
			if o.Name == want.namespace && o.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Errorf("namespace %s is not enforced restricted: %v", o.Name, o.Labels)
			}
		case *nodev1.RuntimeClass:
			if o.Name != want.runtimeClass || o.Handler != "runsc" {
				t.Errorf("RuntimeClass %s has handler %q, want %s with runsc", o.Name, o.Handler, want.runtimeClass)
			}
		}
	}
	for _, k := range []string{"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"} {
		if !kinds[k] {
			t.Errorf("no %s rendered", k)
		}
	}
	if dep == nil {
		t.Fatal("no Deployment")
	}
	if dep.Namespace != want.namespace {
		t.Errorf("Deployment in namespace %q, want %q", dep.Namespace, want.namespace)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != want.replicas {
		t.Errorf("replicas %v, want %d", dep.Spec.Replicas, want.replicas)
	}
	ps := dep.Spec.Template.Spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		t.Error("the pod may run as root")
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers", len(ps.Containers))
	}
	c := ps.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container security context %+v", sc)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("want liveness on /healthz and readiness on /readyz")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("no resource requests")
	}

	cfg, err := config.Load(viper.New(), cfgPath)
	if err != nil {
		t.Fatalf("the mounted config: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the mounted config: %v", err)
	}
	// The files the config names are where the pod mounts its Secret.
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, f := range []string{cfg.Auth.TokenFile, cfg.Server.SessionKeyFile} {
		if f == "" || !mounts[filepath.Dir(f)] {
			t.Errorf("config names %q, which is not in a mounted volume %v", f, mounts)
		}
	}
	if cfg.Runtime.Backend != "kubernetes" || cfg.Kubernetes.Namespace != want.sandboxes || cfg.Kubernetes.RuntimeClass != want.runtimeClass || cfg.Kubernetes.Kubeconfig != "" {
		t.Errorf("config: backend %q, namespace %q (want %q), runtime class %q (want %q), kubeconfig %q",
			cfg.Runtime.Backend, cfg.Kubernetes.Namespace, want.sandboxes, cfg.Kubernetes.RuntimeClass, want.runtimeClass, cfg.Kubernetes.Kubeconfig)
	}
}
