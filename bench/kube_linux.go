package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/backend/kube"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
)

// The Kubernetes modes: a pod per run on the cluster --kubeconfig names,
// directly through the backend and through MCP, cold and from warm pods.
const (
	ModeK8sCold    = "k8s-cold"
	ModeK8sWarm    = "k8s-warm"
	ModeMCPK8sCold = "mcp-k8s-cold"
	ModeMCPK8sWarm = "mcp-k8s-warm"
)

// KubeModes are the modes that need a cluster.
var KubeModes = []string{ModeK8sCold, ModeK8sWarm, ModeMCPK8sCold, ModeMCPK8sWarm}

// isKube reports whether mode runs on the cluster.
func isKube(mode string) bool { return slices.Contains(KubeModes, mode) }

// kubeEnv is the cluster the Kubernetes modes run on, and a namespace of
// the benchmark's own there, deleted at the end.
type kubeEnv struct {
	cfg       config.KubernetesConfig
	client    *kubernetes.Clientset
	namespace string
}

func newKubeEnv(ctx context.Context, kubeconfig string, base config.KubernetesConfig) (*kubeEnv, error) {
	if kubeconfig == "" {
		return nil, fmt.Errorf("the Kubernetes modes need --kubeconfig (scripts/cluster.sh kubeconfig names the test cluster's)")
	}
	k := base
	k.Kubeconfig = kubeconfig
	cs, _, err := kube.Connect(k)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	k.Namespace = "airlock-bench-" + hex.EncodeToString(b)
	if err := createNamespace(ctx, cs, k.Namespace, nil); err != nil {
		return nil, err
	}
	return &kubeEnv{cfg: k, client: cs, namespace: k.Namespace}, nil
}

// close deletes the namespace and waits until it is gone.
func (e *kubeEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = deleteNamespace(ctx, e.client, e.namespace, 2*time.Minute)
}

// createNamespace makes a namespace of the benchmark's own and waits until
// pods may go there: they are refused until its default service account
// exists. A namespace that cannot be used is deleted again.
func createNamespace(ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string) error {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	err := waitUntil(ctx, time.Minute, "the default service account of "+name, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = deleteNamespace(dctx, cs, name, 2*time.Minute)
	}
	return err
}

// deleteNamespace deletes a namespace and waits until it is gone.
func deleteNamespace(ctx context.Context, cs kubernetes.Interface, name string, limit time.Duration) error {
	_ = cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	return waitUntil(ctx, limit, "namespace "+name+" gone", func() (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// count is how many of airlock's pods in the namespace match selector.
func (e *kubeEnv) count(ctx context.Context, selector string) (int, error) {
	list, err := e.client.CoreV1().Pods(e.namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelManagedBy + "=" + kube.ManagedBy + selector})
	if err != nil {
		return 0, err
	}
	return len(list.Items), nil
}

// ready waits until n warm pods are ready and no pod of a run is left.
func (e *kubeEnv) ready(ctx context.Context, n int) error {
	for {
		warm, err := e.count(ctx, ","+kube.LabelPool+"=ready")
		if err != nil {
			return err
		}
		busy, err := e.count(ctx, ","+kube.LabelRun)
		if err != nil {
			return err
		}
		if warm >= n && busy == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// newKubeRunner runs the backend directly, with a pool of maxC warm pods
// when warm.
func newKubeRunner(ctx context.Context, s *boot.Stack, e *kubeEnv, warm bool, maxC int) (Runner, error) {
	cfg := s.Config
	cfg.Kubernetes = e.cfg
	cfg.Pool.Size = 0
	if warm {
		cfg.Pool.Size = maxC
	}
	cfg.Limits.Concurrency, cfg.Limits.Queue = maxC, maxC
	m, err := kube.Up(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	r := &manager{m: m, limits: cfg.Limits.RunLimits(0), close: func() { _ = m.Close(context.Background()) }}
	r.ready = func(ctx context.Context, n int) error {
		if warm {
			if err := e.ready(ctx, n); err != nil {
				return err
			}
		}
		m.WaitTeardowns()
		return nil
	}
	return r, nil
}

// kubeMCPConfig is the server configuration of the MCP Kubernetes modes.
func (e *kubeEnv) mcpConfig() string {
	return fmt.Sprintf("runtime: {backend: kubernetes}\nkubernetes: {kubeconfig: %s, namespace: %s}\n",
		strconv.Quote(e.cfg.Kubeconfig), e.namespace)
}
