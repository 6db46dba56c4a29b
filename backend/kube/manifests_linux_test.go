package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// k8sBin is the path of one of the binaries install-k8s.sh builds.
func k8sBin(name string) string {
	dir := os.Getenv("AIRLOCK_K8S_DIR")
	if dir == "" {
		dir = "/usr/local/lib/airlock/k8s"
	}
	return filepath.Join(dir, "bin", name)
}

// kubectl is the test cluster's kubectl (install-k8s.sh).
func kubectl(t *testing.T) string {
	t.Helper()
	p := k8sBin("kubectl")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kubectl: %v (run scripts/install-k8s.sh)", err)
	}
	return p
}

// kustomizeBase is `kubectl kustomize deploy/kubernetes`: the objects a
// platform team applies, ConfigMap included.
func kustomizeBase(t *testing.T) []kruntime.Object {
	t.Helper()
	out, err := exec.Command(kubectl(t), "kustomize", manifestDir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v%s", manifestDir, err, stderrOf(err))
	}
	return decodeManifests(t, bytes.NewReader(out))
}

// stderrOf is what a failed command wrote to stderr, for the failure
// message: exec's error alone says only "exit status 1".
func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return "\n" + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// renderBase is kustomizeBase with the two namespaces and the
// cluster-wide names made the test's own so that the test shares nothing
// with a real deployment or another test.
func renderBase(t *testing.T, suffix string) (objs []kruntime.Object, nsAirlock, nsSandboxes string) {
	t.Helper()
	nsAirlock, nsSandboxes = "airlock-"+suffix, "airlock-sandboxes-"+suffix
	rename := func(ns string) string {
		switch ns {
		case "airlock":
			return nsAirlock
		case "airlock-sandboxes":
			return nsSandboxes
		}
		return ns
	}
	for _, obj := range kustomizeBase(t) {
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		m.SetNamespace(rename(m.GetNamespace()))
		switch o := obj.(type) {
		case *corev1.Namespace:
			o.Name = rename(o.Name)
		case *rbacv1.RoleBinding:
			for i := range o.Subjects {
				o.Subjects[i].Namespace = rename(o.Subjects[i].Namespace)
			}
		case *rbacv1.ClusterRoleBinding:
			o.Name += "-" + suffix
			o.RoleRef.Name += "-" + suffix
			for i := range o.Subjects {
				o.Subjects[i].Namespace = rename(o.Subjects[i].Namespace)
			}
		case *rbacv1.ClusterRole:
			o.Name += "-" + suffix
			for i := range o.Rules {
				for j := range o.Rules[i].ResourceNames {
					o.Rules[i].ResourceNames[j] = rename(o.Rules[i].ResourceNames[j])
				}
			}
		}
		objs = append(objs, obj)
	}
	return objs, nsAirlock, nsSandboxes
}

// createBase creates the rendered RBAC, namespaces and config map (the
// Deployment, Service and budget wait for airlock's own image), and
// removes them when the test ends.
func createBase(t *testing.T, cs *kubernetes.Clientset, objs []kruntime.Object) {
	t.Helper()
	ctx := context.Background()
	var undo []func() error
	t.Cleanup(func() {
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	var err error
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			name := o.Name
			undo = append(undo, func() error { return cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			name := o.Name
			undo = append(undo, func() error { return cs.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			name := o.Name
			undo = append(undo, func() error { return cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}) })
		case *networkingv1.NetworkPolicy:
			_, err = cs.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *nodev1.RuntimeClass:
			// The test cluster has it (cluster.sh); it must match.
			var rc *nodev1.RuntimeClass
			if rc, err = cs.NodeV1().RuntimeClasses().Get(ctx, o.Name, metav1.GetOptions{}); err == nil && rc.Handler != o.Handler {
				t.Errorf("RuntimeClass %s: the base's handler %q, the cluster's %q", o.Name, o.Handler, rc.Handler)
			}
		default:
			continue
		}
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
}

// Applied to the real cluster, the base lets airlock's service account do
// what the backend needs and nothing more: no Secret anywhere, no pod
// outside the sandbox namespace, no exec, no RBAC of its own; Pod Security
// admission refuses a privileged or host-path pod in the sandbox namespace
// and admits the backend's own sandbox pod; airlock's pod passes
// "restricted" in its namespace.
func TestManifestsOnCluster(t *testing.T) {
	cs, cfg := needCluster(t)
	ctx := context.Background()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	objs, nsA, nsS := renderBase(t, hex.EncodeToString(b))
	createBase(t, cs, objs)
	for _, ns := range []string{nsA, nsS} {
		waitFor(t, time.Minute, "the default service account of "+ns, func() (bool, error) {
			_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		})
	}

	imp := rest.CopyConfig(cfg)
	imp.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + nsA + ":airlock",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + nsA, "system:authenticated"}}
	sa, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}

	// What airlock doctor asks, as the service account.
	for _, c := range permissionChecks(ctx, sa, nsS, "gvisor") {
		if !c.OK {
			t.Errorf("doctor's permission check as the service account: %s", c.Detail)
		}
	}
	// A network RuntimeClass the ClusterRole does not name: doctor says which.
	if c := permissionChecks(ctx, sa, nsS, "gvisor", netRuntimeClass); len(c) != 1 || c[0].OK ||
		c[0].Detail != "missing: get runtimeclasses.node.k8s.io "+netRuntimeClass {
		t.Errorf("doctor's permission check with %s, which the base does not grant: %+v", netRuntimeClass, c)
	}
	denied := []authorizationv1.ResourceAttributes{
		{Namespace: nsS, Resource: "secrets", Verb: "get"},
		{Namespace: nsS, Resource: "secrets", Verb: "list"},
		{Namespace: nsA, Resource: "secrets", Verb: "get"},
		{Namespace: "default", Resource: "secrets", Verb: "list"},
		{Namespace: nsA, Resource: "configmaps", Verb: "get"},
		{Namespace: "default", Resource: "configmaps", Verb: "list"}, // the approval board is in the sandbox namespace only
		{Namespace: nsA, Resource: "pods", Verb: "create"},
		{Namespace: "default", Resource: "pods", Verb: "create"},
		{Namespace: "kube-system", Resource: "pods", Verb: "list"},
		{Resource: "pods", Verb: "list"}, // every namespace
		{Namespace: nsS, Resource: "pods", Subresource: "exec", Verb: "create"},
		{Namespace: nsS, Resource: "pods", Verb: "patch"},
		{Namespace: nsS, Resource: "services", Verb: "create"},
		{Namespace: nsS, Resource: "rolebindings", Group: "rbac.authorization.k8s.io", Verb: "create"},
		{Namespace: nsS, Resource: "roles", Group: "rbac.authorization.k8s.io", Verb: "update"},
		{Namespace: nsS, Resource: "networkpolicies", Group: "networking.k8s.io", Verb: "delete"},
		{Resource: "namespaces", Name: "default", Verb: "get"},
		{Resource: "namespaces", Name: nsS, Verb: "update"},
		{Resource: "nodes", Verb: "get"},
		{Resource: "nodes", Subresource: "proxy", Verb: "get"},
		{Resource: "runtimeclasses", Group: "node.k8s.io", Verb: "create"},
		{Resource: "runtimeclasses", Group: "node.k8s.io", Name: "runc", Verb: "get"},
	}
	for _, ra := range denied {
		r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("access review %+v: %v", ra, err)
		}
		if r.Status.Allowed {
			t.Errorf("the service account may %s %s/%s in %q (name %q); want denied", ra.Verb, ra.Resource, ra.Subresource, ra.Namespace, ra.Name)
		}
	}

	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	p := policy()
	p.Namespace, p.Name, p.Image = nsS, "airlock-admission", testImage
	p.NodeSelector, p.Tolerations, p.SchedulerName = nil, nil, ""
	sandbox, err := Pod(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.CoreV1().Pods(nsS).Create(ctx, sandbox, dry); err != nil {
		t.Errorf("the backend's sandbox pod, as the service account: %v; want admitted", err)
	}
	// A privileged pod is refused whichever layer says so first (Pod
	// Security admission, or an API server without --allow-privileged);
	// the others only Pod Security admission refuses.
	privileged := sandbox.DeepCopy()
	yes := true
	privileged.Spec.Containers[0].SecurityContext.Privileged = &yes
	privileged.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
	if _, err := sa.CoreV1().Pods(nsS).Create(ctx, privileged, dry); err == nil {
		t.Error("a privileged pod in the sandbox namespace was admitted")
	}
	sysAdmin := sandbox.DeepCopy()
	caps := sysAdmin.Spec.Containers[0].SecurityContext.Capabilities
	caps.Add = append(caps.Add, "SYS_ADMIN")
	hostPath := sandbox.DeepCopy()
	hostPath.Spec.Volumes = append(hostPath.Spec.Volumes, corev1.Volume{Name: "host",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
	hostNet := sandbox.DeepCopy()
	hostNet.Spec.HostNetwork = true
	hostPID := sandbox.DeepCopy()
	hostPID.Spec.HostPID = true
	for name, po := range map[string]*corev1.Pod{"CAP_SYS_ADMIN": sysAdmin, "host path": hostPath, "host network": hostNet, "host PID": hostPID} {
		_, err := sa.CoreV1().Pods(nsS).Create(ctx, po, dry)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Errorf("a %s pod in the sandbox namespace: err %v; want refused by Pod Security admission", name, err)
		}
	}

	// airlock's own pod passes "restricted"; the sandbox pod would not,
	// which shows the label is enforced at all.
	var dep *appsv1.Deployment
	for _, obj := range objs {
		if d, ok := obj.(*appsv1.Deployment); ok {
			dep = d
		}
	}
	if dep == nil {
		t.Fatal("no Deployment rendered")
	}
	own := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "airlock-admission", Namespace: nsA, Labels: dep.Spec.Template.Labels}, Spec: dep.Spec.Template.Spec}
	if _, err := cs.CoreV1().Pods(nsA).Create(ctx, own, dry); err != nil {
		t.Errorf("airlock's pod in its restricted namespace: %v; want admitted", err)
	}
	inA := sandbox.DeepCopy()
	inA.Namespace = nsA
	if _, err := cs.CoreV1().Pods(nsA).Create(ctx, inA, dry); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Errorf("a sandbox pod in airlock's restricted namespace: err %v; want refused", err)
	}
}
