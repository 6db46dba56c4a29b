package bench

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/backend/kube"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
)

// kwokStages make kwok's fake nodes Ready and its fake pods Running.
//
//go:embed kwok-stages.yaml
var kwokStages []byte

// ClaimOptions say how the warm-pod claim benchmark runs: Nodes fake
// nodes (kwok), a pool of Pool ready pods on them, and Replicas claimers
// (each an airlock replica's: its own client, rate limit and watch)
// taking pods at each of Rates, Claims per rate, then Burst at once.
type ClaimOptions struct {
	Nodes    int   `json:"nodes"`
	Pool     int   `json:"pool"`
	Replicas int   `json:"replicas"`
	Rates    []int `json:"rates"`
	Claims   int   `json:"claims_per_rate"`
	Burst    int   `json:"burst"`
	// QPS and Burst of each replica's client (kubernetes.qps, .burst).
	QPS      float64      `json:"replica_qps"`
	QPSBurst int          `json:"replica_burst"`
	Kwok     string       `json:"-"`
	Kube     string       `json:"-"`
	WorkDir  string       `json:"-"`
	Log      *slog.Logger `json:"-"`
}

// ClaimRow is one step: Claims claims sent at Rate a second (0: all at
// once), what they achieved, and their latency from when each was due.
type ClaimRow struct {
	Rate      int     `json:"rate"`
	Claims    int     `json:"claims"`
	Claimed   int     `json:"claimed"`
	Missed    int     `json:"missed"`
	Conflicts int64   `json:"conflicts"`
	PerSecond float64 `json:"claims_per_s"`
	P50       float64 `json:"p50_ms"`
	P90       float64 `json:"p90_ms"`
	P99       float64 `json:"p99_ms"`
	Max       float64 `json:"max_ms"`
}

// ClaimReport is what one claim benchmark found.
type ClaimReport struct {
	Started time.Time    `json:"started"`
	Took    string       `json:"took"`
	Machine Machine      `json:"machine"`
	Options ClaimOptions `json:"options"`
	// FillSeconds is how long the first pool of Pool pods took from the
	// first create to all Running on the fake nodes.
	FillSeconds float64    `json:"fill_s"`
	Rows        []ClaimRow `json:"rows"`
}

// Claims runs the claim benchmark against the cluster o.Kube names. Its
// fake nodes, namespace and pods are its own, and gone when it returns.
func Claims(ctx context.Context, o ClaimOptions) (rep *ClaimReport, err error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Nodes < 1 || o.Pool < 1 || o.Replicas < 1 || o.Claims < 1 || o.Claims > o.Pool || o.Burst > o.Pool {
		return nil, fmt.Errorf("claim benchmark: want nodes, pool, replicas and claims of at least 1, and claims and burst at most the pool")
	}
	rep = &ClaimReport{Started: time.Now().UTC(), Options: o, Machine: hostMachine()}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	admin, err := claimClient(o.Kube, 500, 1000)
	if err != nil {
		return nil, err
	}
	if o.WorkDir == "" {
		if o.WorkDir, err = os.MkdirTemp("", "airlock-kwok-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(o.WorkDir)
	}
	// Cleanup in reverse: pods and namespace (kwok must still run to let
	// bound pods go), then nodes, then kwok.
	stopKwok, err := startKwok(ctx, o)
	if err != nil {
		return nil, err
	}
	defer stopKwok()
	env := &kwokEnv{client: admin, id: id, ns: "airlock-kwok-" + id}
	// Anything left behind fails the run.
	defer func() {
		if cerr := env.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("claim benchmark cleanup: %w", cerr))
			rep = nil
		}
	}()
	if err := env.setUp(ctx, o.Nodes); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := env.fill(ctx, o.Pool); err != nil {
		return nil, err
	}
	rep.FillSeconds = time.Since(t0).Seconds()
	o.Log.Info("pool ready", "pods", o.Pool, "took", time.Since(t0).Round(time.Millisecond))

	claimers := make([]*kube.Claimer, o.Replicas)
	for i := range claimers {
		cs, err := claimClient(o.Kube, o.QPS, o.QPSBurst)
		if err != nil {
			return nil, err
		}
		lease, err := env.lease(ctx, i)
		if err != nil {
			return nil, err
		}
		claimers[i] = kube.NewClaimer(kube.ClaimerOptions{Client: cs, Namespace: env.ns, Shape: env.shape(),
			Instance: fmt.Sprintf("bench-%s-%d", id, i), Owner: lease, MaxTimeout: time.Minute, Log: o.Log})
		defer claimers[i].Stop()
	}
	steps := append([]int{}, o.Rates...)
	if o.Burst > 0 {
		steps = append(steps, 0)
	}
	for _, rate := range steps {
		n := o.Claims
		if rate == 0 {
			n = o.Burst
		}
		if err := env.waitCaches(ctx, claimers, o.Pool); err != nil {
			return nil, err
		}
		row, names := claimStep(ctx, claimers, rate, n)
		rep.Rows = append(rep.Rows, row)
		o.Log.Info("claims", "rate", rate, "claimed", row.Claimed, "per_s", fmt.Sprintf("%.1f", row.PerSecond), "p50_ms", row.P50, "p99_ms", row.P99)
		if err := env.check(ctx, names); err != nil {
			return nil, err
		}
		// Refill: the claimed pods go (as after their runs), new ones come.
		if err := env.deleteTaken(ctx); err != nil {
			return nil, err
		}
		if err := env.fill(ctx, o.Pool); err != nil {
			return nil, err
		}
	}
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	return rep, nil
}

// claimClient is a client with its own rate limit and connections, as an
// airlock replica's.
func claimClient(kubeconfig string, qps float64, burst int) (*kubernetes.Clientset, error) {
	cs, _, err := kube.Connect(config.KubernetesConfig{Kubeconfig: kubeconfig, QPS: qps, Burst: burst})
	return cs, err
}

// claimStep sends n claims spread over the claimers at rate a second (0:
// at once) and times each from when it was due, so a slow claim delays
// none behind it.
func claimStep(ctx context.Context, claimers []*kube.Claimer, rate, n int) (ClaimRow, []string) {
	row := ClaimRow{Rate: rate, Claims: n}
	var before int64
	for _, c := range claimers {
		before += c.Conflicts()
	}
	lat := make([]time.Duration, n)
	names := make([]string, n)
	var wg sync.WaitGroup
	start := time.Now()
	var last time.Time
	var mu sync.Mutex
	for i := 0; i < n; i++ {
		due := start
		if rate > 0 {
			due = start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			time.Sleep(time.Until(due))
		}
		wg.Add(1)
		go func(i int, due time.Time) {
			defer wg.Done()
			po := claimers[i%len(claimers)].Claim(ctx, "r"+runtime.NewRunID()[1:])
			done := time.Now()
			lat[i] = done.Sub(due)
			if po != nil {
				names[i] = po.Name
			}
			mu.Lock()
			if done.After(last) {
				last = done
			}
			mu.Unlock()
		}(i, due)
	}
	wg.Wait()
	var ok []time.Duration
	var got []string
	for i := range names {
		if names[i] == "" {
			row.Missed++
			continue
		}
		ok = append(ok, lat[i])
		got = append(got, names[i])
	}
	row.Claimed = len(got)
	for _, c := range claimers {
		row.Conflicts += c.Conflicts()
	}
	row.Conflicts -= before
	if took := last.Sub(start).Seconds(); took > 0 {
		row.PerSecond = float64(row.Claimed) / took
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i] < ok[j] })
	if len(ok) > 0 {
		row.P50, row.P90, row.P99, row.Max = runtime.Millis(percentile(ok, 50)), runtime.Millis(percentile(ok, 90)), runtime.Millis(percentile(ok, 99)), runtime.Millis(ok[len(ok)-1])
	}
	return row, got
}

// startKwok runs kwok against the cluster, managing only nodes annotated
// as its own. Fake nodes and pods get loopback addresses: nothing is ever
// sent to them, and were anything sent, it would stay on this machine.
func startKwok(ctx context.Context, o ClaimOptions) (func(), error) {
	bin := o.Kwok
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("kwok"); err != nil {
			return nil, fmt.Errorf("kwok not found (scripts/install-k8s.sh builds it into /usr/local/lib/airlock/k8s/bin; or pass --kwok): %w", err)
		}
	}
	stages := filepath.Join(o.WorkDir, "kwok-stages.yaml")
	if err := os.WriteFile(stages, kwokStages, 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(o.WorkDir, "kwok.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--kubeconfig="+o.Kube, "--config="+stages,
		"--manage-nodes-with-annotation-selector="+kwokNodeAnnotation+"=fake",
		"--cidr=127.64.0.0/16", "--node-ip=127.0.0.1", "--node-lease-duration-seconds=40")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start kwok: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
		logf.Close()
		out, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("kwok exited at once: %s", strings.TrimSpace(string(out)))
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
	}, nil
}

// kwokNodeAnnotation marks the nodes kwok manages.
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// benchLabel marks everything the claim benchmark makes, with its run id.
const benchLabel = "airlock.dev/bench"

// kwokEnv is one benchmark run's fake nodes and namespace.
type kwokEnv struct {
	client *kubernetes.Clientset
	id, ns string
	nodes  []string
}

func (e *kwokEnv) shape() string { return "bench-" + e.id }

// setUp makes the namespace and the fake nodes, and waits until kwok says
// every node is Ready.
func (e *kwokEnv) setUp(ctx context.Context, nodes int) error {
	if err := createNamespace(ctx, e.client, e.ns, map[string]string{benchLabel: e.id}); err != nil {
		return err
	}
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("airlock-kwok-%s-%d", e.id, i)
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name,
				Annotations: map[string]string{kwokNodeAnnotation: "fake"},
				Labels:      map[string]string{benchLabel: e.id, "type": "kwok", "kubernetes.io/hostname": name}},
			// Only the benchmark's pods tolerate it: nothing else of the
			// cluster's lands on a node that does not exist.
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: kwokNodeAnnotation, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		}
		if _, err := e.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create fake node %s: %w", name, err)
		}
		e.nodes = append(e.nodes, name)
	}
	return waitUntil(ctx, 2*time.Minute, "fake nodes Ready", func() (bool, error) {
		list, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: benchLabel + "=" + e.id})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range list.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == nodes, nil
	})
}

// lease is replica i's instance Lease, which owns what it claims.
func (e *kwokEnv) lease(ctx context.Context, i int) (metav1.OwnerReference, error) {
	l, err := e.client.CoordinationV1().Leases(e.ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("bench-replica-%d", i)}}, metav1.CreateOptions{})
	if err != nil {
		return metav1.OwnerReference{}, fmt.Errorf("create lease: %w", err)
	}
	return metav1.OwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: l.Name, UID: l.UID}, nil
}

// pod is a warm pod as airlock's pool makes it, placed on a fake node.
func (e *kwokEnv) pod() (*corev1.Pod, error) {
	p, err := kube.Pod(kube.PodPolicy{Name: "airlock-w" + runtime.NewRunID()[1:], Namespace: e.ns,
		Labels: map[string]string{kube.LabelManagedBy: kube.ManagedBy, kube.LabelPool: "ready", kube.LabelShape: e.shape()},
		Image:  "airlock.local/sandbox:bookworm", RuntimeClass: "gvisor", UID: 1000, GID: 1000,
		Preload: true, PreloadModules: []string{"numpy", "pandas"},
		Env:             []string{"HOME=/workspace", "PATH=/usr/local/bin:/usr/bin:/bin"},
		Limits:          runtime.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 128, WorkspaceBytes: 256 << 20, TmpBytes: 64 << 20},
		DeadlineSeconds: 3600, NodeSelector: map[string]string{"type": "kwok"},
		Tolerations: []corev1.Toleration{{Key: kwokNodeAnnotation, Operator: corev1.TolerationOpEqual, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}})
	if err != nil {
		return nil, err
	}
	// Fake nodes have no runsc: the RuntimeClass's handler is never asked.
	p.Spec.RuntimeClassName = nil
	return p, nil
}

// fill creates ready pods until the namespace has want, then waits until
// every one runs on a fake node.
func (e *kwokEnv) fill(ctx context.Context, want int) error {
	pods := e.client.CoreV1().Pods(e.ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	need := want - len(list.Items)
	work := make(chan struct{})
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				p, err := e.pod()
				if err == nil {
					_, err = pods.Create(ctx, p, metav1.CreateOptions{})
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < need; i++ {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("create warm pod: %w", err)
	default:
	}
	return waitUntil(ctx, 5*time.Minute, fmt.Sprintf("%d pods Running", want), func() (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Labels[kube.LabelPool] == "ready" {
				running++
			}
		}
		return running == want, nil
	})
}

// waitCaches waits until every claimer's cache holds the whole pool: the
// refill seen and the claimed pods' leaving reported.
func (e *kwokEnv) waitCaches(ctx context.Context, claimers []*kube.Claimer, want int) error {
	for _, c := range claimers {
		if err := c.WaitSynced(ctx); err != nil {
			return err
		}
	}
	return waitUntil(ctx, 2*time.Minute, "claimers' caches full", func() (bool, error) {
		for _, c := range claimers {
			if c.Ready() != want {
				return false, nil
			}
		}
		return true, nil
	})
}

// check proves the step claimed no pod twice, and that each claimed pod
// says so in the API.
func (e *kwokEnv) check(ctx context.Context, names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return fmt.Errorf("pod %s was claimed twice", n)
		}
		seen[n] = true
	}
	list, err := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelPool + "=taken"})
	if err != nil {
		return err
	}
	if len(list.Items) != len(names) {
		return fmt.Errorf("%d pods are taken in the API, but %d claims succeeded", len(list.Items), len(names))
	}
	for _, p := range list.Items {
		if !seen[p.Name] {
			return fmt.Errorf("pod %s is taken but no claim returned it", p.Name)
		}
	}
	return nil
}

// deleteTaken deletes the claimed pods and waits until they are gone.
func (e *kwokEnv) deleteTaken(ctx context.Context) error {
	pods := e.client.CoreV1().Pods(e.ns)
	grace := int64(0)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace},
		metav1.ListOptions{LabelSelector: kube.LabelPool + "=taken"}); err != nil {
		return fmt.Errorf("delete claimed pods: %w", err)
	}
	return waitUntil(ctx, 2*time.Minute, "claimed pods gone", func() (bool, error) {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: kube.LabelPool + "=taken"})
		return err == nil && len(list.Items) == 0, err
	})
}

// close deletes the namespace (and so its pods), then the fake nodes, and
// waits until both are gone.
func (e *kwokEnv) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	grace := int64(0)
	_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{})
	errs := []error{deleteNamespace(ctx, e.client, e.ns, 3*time.Minute)}
	for _, n := range e.nodes {
		if err := e.client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, waitUntil(ctx, time.Minute, "fake nodes gone", func() (bool, error) {
		list, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: benchLabel + "=" + e.id})
		return err == nil && len(list.Items) == 0, err
	}))
	return errors.Join(errs...)
}

// waitUntil polls cond until it holds, fails, or limit passes.
func waitUntil(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: not within %s", what, limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Markdown is the report as the README's table.
func (r *ClaimReport) Markdown() string {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "# Warm-pod claims on a real API server with kwok (%s)\n\n", r.Started.Format("2006-01-02"))
	fmt.Fprintf(&b, "%d fake nodes, a pool of %d ready pods, %d replicas (each its own client at qps %g, burst %d, and its own watch); %d claims per rate, then %d at once. Machine: %d cores, %s. Pool of %d filled in %.1f s. Took %s.\n\n",
		o.Nodes, o.Pool, o.Replicas, o.QPS, o.QPSBurst, o.Claims, o.Burst, r.Machine.Cores, r.Machine.CPU, o.Pool, r.FillSeconds, r.Took)
	b.WriteString("| sent at | claims | claimed | claims/s | p50 ms | p90 ms | p99 ms | max ms | conflicts |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		rate := fmt.Sprintf("%d/s", row.Rate)
		if row.Rate == 0 {
			rate = "at once"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %d |\n",
			rate, row.Claims, row.Claimed, row.PerSecond, row.P50, row.P90, row.P99, row.Max, row.Conflicts)
	}
	return b.String()
}

// Write saves the report as name.md and name.json in dir.
func (r *ClaimReport) Write(dir, name string) ([]string, error) {
	return writeReport(dir, name, r, r.Markdown())
}
