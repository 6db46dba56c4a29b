package kube

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/checks"
)

// The doctor passes on the test cluster as its admin, and names every
// missing permission, with the fix, for an identity that has none.
func TestDoctorOnCluster(t *testing.T) {
	cs, rc := needCluster(t)
	ns := testNamespace(t, cs)
	cfg := config.Defaults()
	cfg.Runtime.Backend = config.BackendKubernetes
	cfg.Kubernetes.Kubeconfig, cfg.Kubernetes.Namespace = testKubeconfig(), ns
	cfg.Limits.CPUs = 0.2
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	var out strings.Builder
	if !checks.Print(&out, Doctor(context.Background(), cfg, log)) {
		t.Fatalf("doctor failed as the cluster admin:\n%s", out.String())
	}
	// The test's namespace has no NetworkPolicy: the canary reaches the
	// API server, which the doctor reports without failing.
	for _, want := range []string{"ok   permissions", "ok   gvisor", "ok   network      interfaces: lo",
		"WARN network policy NOT enforced in " + ns + ": a canary pod connected to the API server's service", "fix: apply a deny-all NetworkPolicy"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	// A networked pod there would reach the API server: networked runs
	// would fail, which the doctor says when they are offered.
	netCfg := cfg
	netCfg.Kubernetes.NetworkRuntimeClass = netRuntimeClass
	if c := networkCanary(context.Background(), cs, netCfg); c.OK || !strings.Contains(c.Detail, "connected to the API server's service") {
		t.Errorf("networked canary without a policy: %+v; want a failure that it reached the API server", c)
	}
	// With the base's policy, the cluster's enforcer holds the canary in.
	applyPolicy(t, cs, ns)
	if c := policyCanary(context.Background(), cs, cfg); !c.OK || c.Warn || !strings.Contains(c.Detail, "enforced in "+ns+": a canary pod could not connect") {
		t.Errorf("canary under the base's policy: %+v; want enforced", c)
	}
	if c := networkCanary(context.Background(), cs, netCfg); !c.OK || !strings.Contains(c.Detail, "has a network and could not connect") {
		t.Errorf("networked canary under the base's policy: %+v; want ok", c)
	}
	// A network RuntimeClass without a network.
	netCfg.Kubernetes.NetworkRuntimeClass = "gvisor"
	if c := networkCanary(context.Background(), cs, netCfg); c.OK || !strings.Contains(c.Detail, "no network interface but lo") || !strings.Contains(c.Fix, "network = \"sandbox\"") {
		t.Errorf("networked canary under a class with no network: %+v; want a failure naming the fix", c)
	}

	// A service account nobody granted anything.
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secs := int64(600)
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "nobody", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	if len(rc.CAData) == 0 {
		kc.Clusters["c"].CertificateAuthority = rc.CAFile
	}
	kc.AuthInfos["nobody"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "nobody"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "nobody.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	cfg.Kubernetes.Kubeconfig = path
	out.Reset()
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if checks.Print(&out, Doctor(dctx, cfg, log)) {
		t.Fatalf("doctor passed for an identity with no permissions:\n%s", out.String())
	}
	for _, want := range []string{"FAIL permissions", "create pods/attach", "update leases.coordination.k8s.io", "fix: grant them with a Role", "sandbox pod  not tried"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
