package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/checks"
)

// Permission is one thing the backend does on the cluster.
type Permission struct {
	Group, Resource, Subresource, Verb string
	// Cluster says the resource is cluster-scoped (no namespace).
	Cluster bool
}

func (p Permission) String() string {
	r := p.Resource
	if p.Subresource != "" {
		r += "/" + p.Subresource
	}
	if p.Group != "" {
		r += "." + p.Group
	}
	return p.Verb + " " + r
}

// Permissions are every verb the backend uses, and nothing more: what its
// Role must grant in the sandbox namespace (and, cluster-wide, reading its
// namespace and RuntimeClass).
var Permissions = []Permission{
	{Resource: "pods", Verb: "create"}, {Resource: "pods", Verb: "get"}, {Resource: "pods", Verb: "list"},
	{Resource: "pods", Verb: "watch"}, {Resource: "pods", Verb: "update"}, {Resource: "pods", Verb: "delete"},
	{Resource: "pods", Verb: "deletecollection"},
	// The attach stream: create for SPDY, get for the WebSocket upgrade.
	{Resource: "pods", Subresource: "attach", Verb: "create"}, {Resource: "pods", Subresource: "attach", Verb: "get"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "create"}, {Group: "coordination.k8s.io", Resource: "leases", Verb: "get"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "list"}, {Group: "coordination.k8s.io", Resource: "leases", Verb: "update"},
	{Group: "coordination.k8s.io", Resource: "leases", Verb: "delete"},
	// The approval board (board.go): one ConfigMap per console request.
	{Resource: "configmaps", Verb: "create"}, {Resource: "configmaps", Verb: "get"}, {Resource: "configmaps", Verb: "list"},
	{Resource: "configmaps", Verb: "watch"}, {Resource: "configmaps", Verb: "update"}, {Resource: "configmaps", Verb: "delete"},
	{Resource: "namespaces", Verb: "get", Cluster: true},
	{Group: "node.k8s.io", Resource: "runtimeclasses", Verb: "get", Cluster: true},
}

// Doctor checks the cluster for what the Kubernetes backend needs, and
// names the fix for each problem: the API server, the namespace, each
// permission (by SelfSubjectAccessReview), the RuntimeClass, and that a
// pod really runs under gVisor with no network; and warns when nothing
// enforces a deny-all NetworkPolicy in the namespace (a canary pod); with
// networked runs offered, checks that a networked pod has a network and
// cannot reach the API server.
func Doctor(ctx context.Context, cfg config.Config, log *slog.Logger) []checks.Check {
	k := cfg.Kubernetes
	var out []checks.Check
	cs, _, err := Connect(k)
	out = append(out, checks.Check{Name: "kubeconfig", OK: err == nil, Detail: kubeconfigDetail(k, err),
		Fix: "set kubernetes.kubeconfig to a kubeconfig file, or run airlock in a pod with a service account"})
	if err != nil {
		return out
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := cs.Discovery().ServerVersion()
	out = append(out, checks.Check{Name: "api server", OK: err == nil, Detail: versionDetail(v, err),
		Fix: "check the kubeconfig's server address and credentials (kubectl version)"})
	if err != nil {
		return out
	}
	_, err = cs.CoreV1().Namespaces().Get(cctx, k.Namespace, metav1.GetOptions{})
	out = append(out, checks.Check{Name: "namespace", OK: err == nil, Detail: detail(k.Namespace, err),
		Fix: "kubectl create namespace " + k.Namespace + " (kubernetes.namespace)"})
	classes := []string{k.RuntimeClass}
	if k.NetworkRuntimeClass != "" {
		classes = append(classes, k.NetworkRuntimeClass)
	}
	out = append(out, permissionChecks(cctx, cs, k.Namespace, classes...)...)
	rc, err := cs.NodeV1().RuntimeClasses().Get(cctx, k.RuntimeClass, metav1.GetOptions{})
	d := detail(k.RuntimeClass, err)
	if err == nil {
		d = fmt.Sprintf("%s (handler %s)", k.RuntimeClass, rc.Handler)
	}
	out = append(out, checks.Check{Name: "runtime class", OK: err == nil, Detail: d,
		Fix: "create a RuntimeClass " + k.RuntimeClass + " whose handler is runsc (the README's Kubernetes section), or set kubernetes.runtime_class"})
	for _, c := range out {
		if !c.OK {
			return append(out, checks.Check{Name: "sandbox pod", Detail: "not tried: fix the problems above first"})
		}
	}
	out = append(out, probePod(ctx, cfg, log)...)
	out = append(out, policyCanary(ctx, cs, cfg))
	if cfg.NetworkOffered() {
		out = append(out, networkCanary(ctx, cs, cfg))
	}
	return out
}

// permissionChecks asks the API server, for each permission, whether
// airlock's identity has it. Cluster-scoped reads are asked by name (the
// namespace, each RuntimeClass: the sandboxes' and the networked ones'),
// so a ClusterRole limited to those names passes.
func permissionChecks(ctx context.Context, cs kubernetes.Interface, namespace string, runtimeClasses ...string) []checks.Check {
	var missing []string
	var errs []string
	for _, p := range Permissions {
		names := []string{""}
		switch {
		case p.Cluster && p.Resource == "namespaces":
			names = []string{namespace}
		case p.Cluster && p.Resource == "runtimeclasses":
			names = runtimeClasses
		}
		for _, name := range names {
			ra := &authorizationv1.ResourceAttributes{Group: p.Group, Resource: p.Resource, Subresource: p.Subresource, Verb: p.Verb, Name: name}
			if !p.Cluster {
				ra.Namespace = namespace
			}
			what := p.String()
			if name != "" {
				what += " " + name
			}
			r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra},
			}, metav1.CreateOptions{})
			switch {
			case err != nil:
				errs = append(errs, what+": "+err.Error())
			case !r.Status.Allowed:
				missing = append(missing, what)
			}
		}
	}
	c := checks.Check{Name: "permissions", OK: len(missing) == 0 && len(errs) == 0,
		Detail: fmt.Sprintf("all %d verbs allowed in %s", len(Permissions), namespace)}
	if !c.OK {
		c.Detail = "missing: " + strings.Join(append(missing, errs...), ", ")
		c.Fix = "grant them with a Role in " + namespace + " (pods, pods/attach, leases) and a ClusterRole to get namespaces and runtimeclasses; the README's Kubernetes section lists them"
	}
	return []checks.Check{c}
}

// probePod runs one sandbox pod and checks from inside that it runs under
// gVisor, as the code's user, with no network.
func probePod(ctx context.Context, cfg config.Config, log *slog.Logger) []checks.Check {
	cfg.Pool.Size = 0
	m, err := Up(ctx, cfg, log)
	if err != nil {
		return []checks.Check{{Name: "sandbox pod", Detail: err.Error(), Fix: "see the error"}}
	}
	defer func() { _ = m.Close(context.WithoutCancel(ctx)) }()
	res, err := m.Run(ctx, runtime.Request{Language: runtime.Shell, Limits: cfg.Limits.RunLimits(0),
		Code: "uname -r; id -u; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '"})
	m.WaitTeardowns()
	if err != nil || res.ExitCode != 0 {
		return []checks.Check{{Name: "sandbox pod", Detail: fmt.Sprintf("%v %s", err, res.Stderr),
			Fix: "kubectl describe the namespace's pods; is the sandbox image (kubernetes.image) on the nodes?"}}
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	for len(lines) < 3 {
		lines = append(lines, "")
	}
	gvisor := strings.Contains(lines[0], "gvisor")
	ifaces := strings.TrimSpace(lines[2])
	return []checks.Check{
		{Name: "gvisor", OK: gvisor, Detail: "kernel " + lines[0],
			Fix: "the RuntimeClass's handler does not run runsc: point it at gVisor's shim"},
		{Name: "user", OK: lines[1] != "0", Detail: "code runs as uid " + lines[1],
			Fix: "sandbox.uid must not be 0"},
		{Name: "network", OK: ifaces == "lo", Detail: "interfaces: " + ifaces,
			Fix: "sandbox pods have a network: set network = \"none\" in the runsc handler's runsc.toml (the README's Kubernetes section)"},
	}
}

func kubeconfigDetail(k config.KubernetesConfig, err error) string {
	if err != nil {
		return err.Error()
	}
	if k.Kubeconfig == "" {
		return "in-cluster service account"
	}
	return k.Kubeconfig
}

func versionDetail(v interface{ String() string }, err error) string {
	if err != nil {
		return err.Error()
	}
	return v.String()
}

func detail(name string, err error) string {
	if err != nil {
		return err.Error()
	}
	return name
}
