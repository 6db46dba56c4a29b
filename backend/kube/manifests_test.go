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

// The base's RBAC grants exactly the backend's Permissions: the
// namespaced ones by a Role in the sandbox namespace only, the cluster
// ones by name; no wildcard, no Secret, nothing else.
func TestManifestsLeastPrivilege(t *testing.T) {
	var want, wantCluster []string
	for _, p := range Permissions {
		if p.Cluster {
			wantCluster = append(wantCluster, p.String())
		} else {
			want = append(want, p.String())
		}
	}
	sort.Strings(want)
	sort.Strings(wantCluster)
	var roles, clusterRoles int
	for _, obj := range baseObjects(t) {
		switch o := obj.(type) {
		case *rbacv1.Role:
			roles++
			if o.Namespace != "airlock-sandboxes" {
				t.Errorf("Role %s in namespace %q; want only the sandbox namespace", o.Name, o.Namespace)
			}
			if got := grants(o.Rules); !slices.Equal(got, want) {
				t.Errorf("Role grants %v\nwant exactly %v", got, want)
			}
		case *rbacv1.ClusterRole:
			clusterRoles++
			if got := grants(o.Rules); !slices.Equal(got, wantCluster) {
				t.Errorf("ClusterRole grants %v\nwant exactly %v", got, wantCluster)
			}
			for _, r := range o.Rules {
				if len(r.ResourceNames) != 1 {
					t.Errorf("ClusterRole rule %v is not limited to one name", r)
				}
			}
		case *rbacv1.RoleBinding:
			if o.RoleRef.Kind != "Role" {
				t.Errorf("RoleBinding %s binds a %s; want only the Role", o.Name, o.RoleRef.Kind)
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
	var dep *appsv1.Deployment
	kinds := map[string]bool{}
	var rcName string
	for _, obj := range baseObjects(t) {
		kinds[obj.GetObjectKind().GroupVersionKind().Kind] = true
		switch o := obj.(type) {
		case *appsv1.Deployment:
			dep = o
		case *corev1.Namespace:
			if o.Name == "airlock" && o.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Errorf("namespace airlock is not enforced restricted: %v", o.Labels)
			}
		case *nodev1.RuntimeClass:
			rcName = o.Name
			if o.Handler != "runsc" {
				t.Errorf("RuntimeClass %s has handler %q, want runsc", o.Name, o.Handler)
			}
		}
	}
	for _, k := range []string{"Namespace", "RuntimeClass", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"} {
		if !kinds[k] {
			t.Errorf("no %s in the base", k)
		}
	}
	if dep == nil {
		t.Fatal("no Deployment")
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
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

	cfg, err := config.Load(viper.New(), filepath.Join(manifestDir, "config.yaml"))
	if err != nil {
		t.Fatalf("the base's config.yaml: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the base's config.yaml: %v", err)
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
	if cfg.Runtime.Backend != "kubernetes" || cfg.Kubernetes.Namespace != "airlock-sandboxes" || cfg.Kubernetes.RuntimeClass != rcName || cfg.Kubernetes.Kubeconfig != "" {
		t.Errorf("config: backend %q, namespace %q, runtime class %q (base has %q), kubeconfig %q",
			cfg.Runtime.Backend, cfg.Kubernetes.Namespace, cfg.Kubernetes.RuntimeClass, rcName, cfg.Kubernetes.Kubeconfig)
	}
}
