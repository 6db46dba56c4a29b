package kube

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/config"
)

// kubernetes.qps and kubernetes.burst hold: after Burst requests at once,
// the client sends no more than QPS a second. A stand-in API server counts
// what arrives; the bound is a lower one on time, so a slow machine only
// makes it pass more easily.
func TestConnectRateLimit(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"x"}}`)
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := config.Defaults().Kubernetes
	if d.QPS != 100 || d.Burst != 200 {
		t.Errorf("defaults: qps %g burst %d, want 100 and 200", d.QPS, d.Burst)
	}
	const qps, burst, requests = 20, 2, 12
	cs, rc, err := Connect(config.KubernetesConfig{Kubeconfig: kc, QPS: qps, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	if rc.QPS != qps || rc.Burst != burst {
		t.Errorf("rest config: qps %g burst %d, want %d and %d", rc.QPS, rc.Burst, qps, burst)
	}
	start := time.Now()
	for i := 0; i < requests; i++ {
		if _, err := cs.CoreV1().Namespaces().Get(context.Background(), "x", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Burst go at once; each further one waits 1/qps.
	least := time.Duration(requests-burst) * time.Second / qps
	if took := time.Since(start); took < least*9/10 {
		t.Errorf("%d requests took %v; at qps %d, burst %d they need at least %v", requests, took, qps, burst, least)
	}
	if got.Load() != requests {
		t.Errorf("server saw %d requests, want %d", got.Load(), requests)
	}
}

// Pods have no resolver: the proxy's advertised address is an IP, from
// the config or the pod, with the listener's port unless one is given.
func TestProxyAddress(t *testing.T) {
	for _, c := range []struct {
		configured, podIP, want, wantErr string
	}{
		{"", "10.1.2.3", "10.1.2.3:3128", ""},
		{"10.9.9.9", "10.1.2.3", "10.9.9.9:3128", ""},
		{"10.9.9.9:8080", "", "10.9.9.9:8080", ""},
		{"", "fd00::5", "[fd00::5]:3128", ""},
		{"", "", "", "$POD_IP is not set"},
		{"airlock-egress.airlock:3128", "10.1.2.3", "", `"airlock-egress.airlock:3128"`},
		{"", "not-an-ip", "", `"not-an-ip"`},
	} {
		got, err := proxyAddress(c.configured, c.podIP, 3128)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q/%q: err %v, want one naming %s", c.configured, c.podIP, err, c.wantErr)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("%q/%q = %v, %v; want %s", c.configured, c.podIP, got, err, c.want)
		}
	}
}
