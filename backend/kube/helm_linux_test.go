package kube

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/viper"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/diff"
)

// chartDir is the Helm chart that deploys what the kustomize base does.
const chartDir = "../../deploy/helm/airlock"

// helmLabels are the labels the chart adds to every object and the base
// lacks: Helm's standard ones, the only difference allowed.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// configChecksum is the pod template's annotation that rolls the
// Deployment when the config changes (the ConfigMap's name does not).
const configChecksum = "checksum/config"

// helm is install-k8s.sh's helm; without it the test fails under CI=true
// and is skipped otherwise.
func helm(t *testing.T) string {
	t.Helper()
	p := k8sBin("helm")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("helm: %v (run sudo scripts/install-k8s.sh)", err)
		}
		t.Skipf("helm: %v (sudo scripts/install-k8s.sh builds it)", err)
	}
	return p
}

// helmTemplate is `helm template airlock deploy/helm/airlock` with the
// given --set values, decoded. The release is named airlock, as the
// README installs it: the chart names its objects after the release.
func helmTemplate(t *testing.T, set ...string) []kruntime.Object {
	t.Helper()
	args := []string{"template", "airlock", chartDir}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(helm(t), args...).Output()
	if err != nil {
		t.Fatalf("helm %s: %v%s", strings.Join(args, " "), err, stderrOf(err))
	}
	return decodeManifests(t, bytes.NewReader(out))
}

// objectKey names an object for matching the two renderings: by kind,
// namespace and name, except the ConfigMap, whose name kustomize hashes.
type objectKey struct{ kind, namespace, name string }

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.kind + " " + k.name
	}
	return k.kind + " " + k.namespace + "/" + k.name
}

// keyOf is obj's objectKey.
func keyOf(t *testing.T, obj kruntime.Object) objectKey {
	t.Helper()
	m, err := meta.Accessor(obj)
	if err != nil {
		t.Fatalf("%T: %v", obj, err)
	}
	k := objectKey{kind: obj.GetObjectKind().GroupVersionKind().Kind, namespace: m.GetNamespace(), name: m.GetName()}
	if k.kind == "ConfigMap" {
		k.name = ""
	}
	return k
}

// airlockConfig is the config.yaml of the one ConfigMap in objs, and the
// ConfigMap's name.
func airlockConfig(t *testing.T, objs []kruntime.Object) (text, name string) {
	t.Helper()
	var n int
	for _, obj := range objs {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			n++
			text, name = cm.Data["config.yaml"], cm.Name
		}
	}
	if n != 1 || text == "" {
		t.Fatalf("%d ConfigMaps (config.yaml %q); want one holding config.yaml", n, text)
	}
	return text, name
}

// configSettings parses a config.yaml as airlock does (viper), so that
// comments, key order and quoting (the chart writes "off", the base off)
// do not count as differences, and a YAML 1.1 false for off would.
func configSettings(t *testing.T, text string) map[string]any {
	t.Helper()
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(strings.NewReader(text)); err != nil {
		t.Fatalf("parse config %q: %v", text, err)
	}
	return v.AllSettings()
}

// podTemplate is the pod template of the one Deployment in objs.
func podTemplate(t *testing.T, objs []kruntime.Object) *corev1.PodTemplateSpec {
	t.Helper()
	for _, obj := range objs {
		if d, ok := obj.(*appsv1.Deployment); ok {
			return &d.Spec.Template
		}
	}
	t.Fatal("no Deployment")
	return nil
}

// checkConfigMount checks that the Deployment of objs mounts the ConfigMap
// named cmName and, if checksum, carries the checksum of its config.yaml.
func checkConfigMount(t *testing.T, objs []kruntime.Object, checksum bool) {
	t.Helper()
	text, cmName := airlockConfig(t, objs)
	tmpl := podTemplate(t, objs)
	var mounted bool
	for _, v := range tmpl.Spec.Volumes {
		if v.ConfigMap != nil {
			mounted = true
			if v.ConfigMap.Name != cmName {
				t.Errorf("volume %s mounts ConfigMap %q; the ConfigMap is %q", v.Name, v.ConfigMap.Name, cmName)
			}
		}
	}
	if !mounted {
		t.Error("the pod mounts no ConfigMap")
	}
	if !checksum {
		return
	}
	sum := sha256.Sum256([]byte(text))
	if got, want := tmpl.Annotations[configChecksum], hex.EncodeToString(sum[:]); got != want {
		t.Errorf("pod annotation %s = %q; want the config's sha256 %q", configChecksum, got, want)
	}
}

// normalize strips from obj what may differ between the chart and the
// base: Helm's labels (which the chart must have), the ConfigMap's name
// and its config.yaml (compared parsed, apart), and the pod's checksum
// annotation and ConfigMap reference (checked by checkConfigMount).
func normalize(t *testing.T, obj kruntime.Object, fromChart bool) kruntime.Object {
	t.Helper()
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		t.Fatalf("%T: %v", obj, err)
	}
	if fromChart {
		labels := m.GetLabels()
		for _, l := range helmLabels {
			if labels[l] == "" {
				t.Errorf("%s has no label %s", keyOf(t, obj), l)
			}
			delete(labels, l)
		}
		m.SetLabels(labels)
	}
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		o.Name = ""
		delete(o.Data, "config.yaml")
	case *appsv1.Deployment:
		delete(o.Spec.Template.Annotations, configChecksum)
		if len(o.Spec.Template.Annotations) == 0 {
			o.Spec.Template.Annotations = nil
		}
		for _, v := range o.Spec.Template.Spec.Volumes {
			if v.ConfigMap != nil {
				v.ConfigMap.Name = ""
			}
		}
	}
	return obj
}

// With default values the chart renders the kustomize base's objects,
// down to every field, but for Helm's labels and the ConfigMap's name (a
// fixed one and a checksum annotation for kustomize's hashed one). This
// keeps the base the one source of the security settings.
func TestHelmChartMatchesKustomize(t *testing.T) {
	chart := helmTemplate(t)
	base := kustomizeBase(t)

	baseConfig, _ := airlockConfig(t, base)
	chartConfig, _ := airlockConfig(t, chart)
	if b, c := configSettings(t, baseConfig), configSettings(t, chartConfig); !reflect.DeepEqual(b, c) {
		t.Errorf("the chart's config.yaml differs from deploy/kubernetes/config.yaml (- base, + chart):\n%s", diff.Diff(b, c))
	}
	checkConfigMount(t, base, false)
	checkConfigMount(t, chart, true)

	want := map[objectKey]kruntime.Object{}
	for _, obj := range base {
		want[keyOf(t, obj)] = normalize(t, obj, false)
	}
	got := map[objectKey]kruntime.Object{}
	for _, obj := range chart {
		k := keyOf(t, obj)
		if _, dup := got[k]; dup {
			t.Errorf("the chart renders %s twice", k)
		}
		got[k] = normalize(t, obj, true)
	}
	var keys []objectKey
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b objectKey) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		w, inBase := want[k]
		g, inChart := got[k]
		switch {
		case !inChart:
			t.Errorf("%s: in the base, not in the chart", k)
		case !inBase:
			t.Errorf("%s: in the chart, not in the base", k)
		case !equality.Semantic.DeepEqual(w, g):
			t.Errorf("%s differs (- base, + chart):\n%s", k, diff.Diff(w, g))
		}
	}
	if len(keys) < 12 {
		t.Errorf("only %d objects compared: %v", len(keys), keys)
	}
}

// With other values, the chart moves everything together: the Role,
// RoleBinding and NetworkPolicy into the sandbox namespace, the config onto it and the
// RuntimeClass, the ClusterRole's names with them; and the RBAC stays
// least privilege and airlock's pod as locked down as the base's.
func TestHelmChartValues(t *testing.T) {
	helm(t) // one skip for the test, not one per case
	moved := []string{"replicas=3", "namespaces.airlock=ai", "namespaces.sandboxes=ai-runs",
		"image.repository=registry.example.com/airlock", "image.tag=v1.2.3", "image.pullPolicy=Always"}
	for _, tc := range []struct {
		name         string
		set          []string
		want         deployment
		image        string
		pullPolicy   corev1.PullPolicy
		secret       string
		poolSize     int
		namespaces   bool // the chart creates the two namespaces
		runtimeClass bool // and the RuntimeClass
	}{{
		name:  "replicas, namespaces and image",
		set:   moved,
		want:  deployment{namespace: "ai", sandboxes: "ai-runs", runtimeClass: "gvisor", replicas: 3},
		image: "registry.example.com/airlock:v1.2.3", pullPolicy: corev1.PullAlways, secret: "airlock-secrets", poolSize: 2,
		namespaces: true, runtimeClass: true,
	}, {
		// kubernetes.namespace set in the config follows namespaces.sandboxes all the same.
		name: "config, secret and RuntimeClass",
		set: append(slices.Clone(moved), "config.pool.size=5", "config.kubernetes.namespace=elsewhere",
			"secretName=ai-secrets", "runtimeClass.name=gvisor-kvm", "runtimeClass.handler=runsc"),
		want:  deployment{namespace: "ai", sandboxes: "ai-runs", runtimeClass: "gvisor-kvm", replicas: 3},
		image: "registry.example.com/airlock:v1.2.3", pullPolicy: corev1.PullAlways, secret: "ai-secrets", poolSize: 5,
		namespaces: true, runtimeClass: true,
	}, {
		// The networked runs' class is readable too, and only then.
		name:  "a network RuntimeClass",
		set:   []string{"config.kubernetes.network_runtime_class=gvisor-net"},
		want:  deployment{namespace: "airlock", sandboxes: "airlock-sandboxes", runtimeClass: "gvisor", netClass: "gvisor-net", replicas: 2},
		image: "airlock.local/airlock:dev", pullPolicy: corev1.PullIfNotPresent, secret: "airlock-secrets", poolSize: 2,
		namespaces: true, runtimeClass: true,
	}, {
		name:  "namespaces and RuntimeClass already on the cluster",
		set:   []string{"namespaces.create=false", "runtimeClass.create=false"},
		want:  baseDeployment,
		image: "airlock.local/airlock:dev", pullPolicy: corev1.PullIfNotPresent, secret: "airlock-secrets", poolSize: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := helmTemplate(t, tc.set...)
			checkLeastPrivilege(t, objs, tc.want)
			cfgText, _ := airlockConfig(t, objs)
			cfgPath := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
				t.Fatal(err)
			}
			checkAirlockPod(t, objs, cfgPath, tc.want)
			checkConfigMount(t, objs, true)
			if got := configSettings(t, cfgText)["pool"]; !reflect.DeepEqual(got, map[string]any{"size": tc.poolSize}) {
				t.Errorf("config pool %v, want size %d", got, tc.poolSize)
			}

			var namespaces []string
			var runtimeClasses int
			for _, obj := range objs {
				switch o := obj.(type) {
				case *corev1.Namespace:
					namespaces = append(namespaces, o.Name)
				case *nodev1.RuntimeClass:
					runtimeClasses++
				case *rbacv1.RoleBinding:
					for _, s := range o.Subjects {
						if s.Kind != "ServiceAccount" || s.Namespace != tc.want.namespace {
							t.Errorf("RoleBinding %s binds %s %s/%s; want airlock's service account in %s", o.Name, s.Kind, s.Namespace, s.Name, tc.want.namespace)
						}
					}
				case *networkingv1.NetworkPolicy:
					if o.Namespace != tc.want.sandboxes {
						t.Errorf("NetworkPolicy %s in namespace %q; want the sandbox namespace %q", o.Name, o.Namespace, tc.want.sandboxes)
					}
				case *corev1.ConfigMap, *corev1.ServiceAccount, *corev1.Service:
					if k := keyOf(t, obj); k.namespace != tc.want.namespace {
						t.Errorf("%s: want namespace %q", k, tc.want.namespace)
					}
				}
			}
			var wantNS []string
			if tc.namespaces {
				wantNS = []string{tc.want.namespace, tc.want.sandboxes}
			}
			slices.Sort(namespaces)
			slices.Sort(wantNS)
			if !slices.Equal(namespaces, wantNS) {
				t.Errorf("namespaces %v rendered, want %v", namespaces, wantNS)
			}
			wantRC := 0
			if tc.runtimeClass {
				wantRC = 1
			}
			if runtimeClasses != wantRC {
				t.Errorf("%d RuntimeClasses rendered, want %d", runtimeClasses, wantRC)
			}

			ps := podTemplate(t, objs).Spec
			if c := ps.Containers[0]; c.Image != tc.image || c.ImagePullPolicy != tc.pullPolicy {
				t.Errorf("image %q (%s), want %q (%s)", c.Image, c.ImagePullPolicy, tc.image, tc.pullPolicy)
			}
			for _, v := range ps.Volumes {
				if v.Secret != nil && v.Secret.SecretName != tc.secret {
					t.Errorf("the pod mounts Secret %q, want %q", v.Secret.SecretName, tc.secret)
				}
			}
		})
	}
}

// helm lint --strict passes on the chart, with its defaults and with
// other values; its schema refuses values that would render a broken
// deployment.
func TestHelmLint(t *testing.T) {
	bin := helm(t)
	for _, tc := range []struct {
		name string
		set  []string
		ok   bool
	}{
		{name: "defaults", ok: true},
		{name: "other values", set: []string{"replicas=3", "namespaces.sandboxes=ai-runs", "image.tag=v1.2.3", "config.pool.size=5"}, ok: true},
		{name: "negative replicas", set: []string{"replicas=-1"}},
		{name: "namespace not a DNS label", set: []string{"namespaces.sandboxes=Sandboxes_1"}},
		{name: "unknown pull policy", set: []string{"image.pullPolicy=Sometimes"}},
		{name: "misspelt value", set: []string{"replica=3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.Command(bin, args...).CombinedOutput()
			if tc.ok && err != nil {
				t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			if !tc.ok && err == nil {
				t.Errorf("helm %s passed; want the schema to refuse it:\n%s", strings.Join(args, " "), out)
			}
			t.Logf("helm %s:\n%s", strings.Join(args, " "), out)
		})
	}
}
