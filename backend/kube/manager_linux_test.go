package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlock-mcp/airlock/runtime"
)

// testLimits are small: the test cluster's one node has 2 CPUs to give,
// and every pod requests what it may use.
func testLimits() runtime.Limits {
	return runtime.Limits{Timeout: 60 * time.Second, MemoryBytes: 256 << 20, CPUs: 0.2, Pids: 64,
		StdoutBytes: 64 << 10, StderrBytes: 64 << 10, WorkspaceBytes: 64 << 20, TmpBytes: 64 << 20}
}

// testManager starts a Manager on a namespace of the test's own.
func testManager(t *testing.T, concurrency int) (*Manager, *kubernetes.Clientset, string) {
	t.Helper()
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	return newTestManager(t, cs, cfg, ns, concurrency, 0), cs, ns
}

// newTestManager starts a Manager on namespace ns with poolSize warm pods
// (no modules preloaded), and closes it when the test ends.
func newTestManager(t *testing.T, cs *kubernetes.Clientset, cfg *rest.Config, ns string, concurrency, poolSize int) *Manager {
	t.Helper()
	return newTestManagerWith(t, cs, cfg, ns, concurrency, poolSize, func(*Options) {})
}

// newTestManagerWith is newTestManager with the options changed by edit.
func newTestManagerWith(t *testing.T, cs *kubernetes.Clientset, cfg *rest.Config, ns string, concurrency, poolSize int, edit func(*Options)) *Manager {
	t.Helper()
	o := Options{
		PoolSize: poolSize, PoolLimits: testLimits(), PoolMaxIdle: 10 * time.Minute, MaxTimeout: 5 * time.Minute,
		Client: cs, REST: cfg, Namespace: ns, InstanceID: runtime.NewRunID(),
		Image: testImage, RuntimeClass: "gvisor", ScheduleTimeout: time.Minute,
		UID: 1000, GID: 1000, Env: map[string]string{"GRANTED": "yes"},
		Concurrency: concurrency, Queue: 64, QueueWait: 5 * time.Minute,
		Breaker: runtime.BreakerOptions{Failures: 0},
		Log:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	edit(&o)
	m, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.WaitTeardowns()
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m
}

// openTestSession opens a session for client alice on m (idle 5 min,
// lifetime 10 min).
func openTestSession(t *testing.T, m *Manager) (string, runtime.Session) {
	t.Helper()
	id := "s" + runtime.NewRunID()
	s, err := m.OpenSession(context.Background(), runtime.SessionOptions{ID: id, Limits: testLimits(), Owner: "alice", Idle: 5 * time.Minute, Lifetime: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return id, s
}

// twoManagers starts two Managers, as two airlock replicas, on a
// namespace of the test's own.
func twoManagers(t *testing.T) (*kubernetes.Clientset, string, *Manager, *Manager) {
	t.Helper()
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	return cs, ns, newTestManager(t, cs, cfg, ns, 2, 0), newTestManager(t, cs, cfg, ns, 2, 0)
}

// runPython runs code in session s with the test limits.
func runPython(s runtime.Session, code string) (runtime.Result, error) {
	return s.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: code, Limits: testLimits()})
}

// instancePods lists the pods a manager's instance has on the cluster.
func instancePods(t *testing.T, cs *kubernetes.Clientset, ns string, m *Manager) int {
	t.Helper()
	list, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelInstance + "=" + m.InstanceID()})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// The core cases of the local backend, each in a pod of its own, with
// the same results; and nothing of the runs left on the cluster.
func TestManagerRunsInPods(t *testing.T) {
	m, cs, ns := testManager(t, 2)
	t.Setenv("AIRLOCK_SERVER_SECRET", "must-not-be-seen")
	lim := testLimits()
	short := lim
	short.Timeout = 3 * time.Second
	flood := lim
	flood.StdoutBytes = 1000
	small := lim
	small.MemoryBytes = 128 << 20
	few := lim
	few.Pids = 16
	cases := []struct {
		name string
		lang runtime.Language
		code string
		lim  runtime.Limits
		ok   func(r runtime.Result) bool
	}{
		{"gVisor's kernel", runtime.Python, "import platform; print(platform.release())", lim,
			func(r runtime.Result) bool { return r.ExitCode == 0 && strings.Contains(r.Stdout, "gvisor") }},
		{"exit code", runtime.Shell, "echo out; echo err >&2; exit 3", lim,
			func(r runtime.Result) bool { return r.ExitCode == 3 && r.Stdout == "out\n" && r.Stderr == "err\n" }},
		{"not root", runtime.Python, "import os; print(os.getuid(), os.getgid())", lim,
			func(r runtime.Result) bool { return r.Stdout == "1000 1000\n" }},
		{"read-only root", runtime.Shell, "touch /x 2>/dev/null; echo $?", lim,
			func(r runtime.Result) bool { return strings.TrimSpace(r.Stdout) != "0" }},
		{"capped workspace", runtime.Shell, "df -k /workspace | tail -1", lim,
			func(r runtime.Result) bool { return strings.Contains(r.Stdout, "65536") }},
		{"no network", runtime.Shell, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", lim,
			func(r runtime.Result) bool { return strings.TrimSpace(r.Stdout) == "lo" }},
		{"only the granted environment", runtime.Shell, "env", lim,
			func(r runtime.Result) bool {
				return strings.Contains(r.Stdout, "GRANTED=yes") && !strings.Contains(r.Stdout, "must-not-be-seen")
			}},
		{"timeout kills the pod", runtime.Shell, "echo started; sleep 60", short,
			func(r runtime.Result) bool {
				return r.TimedOut && r.Reason == runtime.ReasonTimeout && r.Stdout == "started\n"
			}},
		{"output capped", runtime.Python, "print('o' * 100000)", flood,
			func(r runtime.Result) bool {
				return r.StdoutTruncated && r.Reason == runtime.ReasonOutputCapped && strings.HasPrefix(r.Stdout, strings.Repeat("o", 1000))
			}},
		{"memory bomb", runtime.Python, "b = []\nwhile True: b.append(bytearray(16 << 20))", small,
			func(r runtime.Result) bool { return r.OOMKilled && r.Reason == runtime.ReasonOutOfMemory }},
		{"fork bomb contained", runtime.Python, "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped at', n, e.errno)", few,
			func(r runtime.Result) bool { return strings.HasPrefix(r.Stdout, "stopped at") && !r.TimedOut }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := m.Run(context.Background(), runtime.Request{Language: c.lang, Code: c.code, Limits: c.lim})
			if err != nil || !c.ok(r) {
				t.Errorf("result %+v, err %v", r, err)
			}
		})
	}
	m.WaitTeardowns()
	if n := instancePods(t, cs, ns, m); n != 0 {
		t.Errorf("%d pods of this instance left after the runs", n)
	}
}

// A cancelled run's pod goes, and the run says it was cancelled.
func TestManagerCancel(t *testing.T) {
	m, cs, ns := testManager(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan struct{}, 1)
	req := runtime.Request{Language: runtime.Shell, Code: "echo go; sleep 60", Limits: testLimits(),
		Output: func(runtime.Stream, []byte) {
			select {
			case out <- struct{}{}:
			default:
			}
		}}
	done := make(chan error, 1)
	go func() {
		_, err := m.Run(ctx, req)
		done <- err
	}()
	select {
	case <-out:
	case err := <-done:
		t.Fatalf("the run ended before its first output: %v", err)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("err %v, want context.Canceled", err)
	}
	m.WaitTeardowns()
	if n := instancePods(t, cs, ns, m); n != 0 {
		t.Errorf("%d pods left after a cancelled run", n)
	}
}

// An instance's Lease is found expired only once it stopped renewing; a
// sweep deletes it (the garbage collector then deletes its pods) and
// leaves live and foreign Leases alone.
func TestSweepExpiredLeases(t *testing.T) {
	cs, _ := needCluster(t)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	mk := func(name string, labels map[string]string, renewed time.Time) {
		secs := int32(30)
		rt := metav1.NewMicroTime(renewed)
		_, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       coordinationv1.LeaseSpec{LeaseDurationSeconds: &secs, RenewTime: &rt},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	ours := func(id string) map[string]string {
		return map[string]string{LabelManagedBy: ManagedBy, LabelInstance: id}
	}
	now := time.Now()
	mk("airlock-dead", ours("dead"), now.Add(-2*time.Minute))
	mk("airlock-alive", ours("alive"), now)
	mk("someone-elses", map[string]string{"app": "x"}, now.Add(-time.Hour))
	n, err := SweepExpired(ctx, cs, ns, now)
	if err != nil || n != 1 {
		t.Fatalf("swept %d, %v; want 1", n, err)
	}
	for name, want := range map[string]bool{"airlock-dead": false, "airlock-alive": true, "someone-elses": true} {
		_, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if got := !apierrors.IsNotFound(err); got != want {
			t.Errorf("lease %s exists = %v, want %v (%v)", name, got, want, err)
		}
	}
}

// Two airlock instances on one namespace share warm pods: 40 runs fired at
// both at once each get a pod no other run had (the code finds no mark a
// previous run left in /workspace, and no pod's run label ever changes),
// warm pods serve some of them, and no taken pod is left afterwards.
func TestWarmPodsAcrossInstances(t *testing.T) {
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	a := newTestManager(t, cs, cfg, ns, 3, 2)
	b := newTestManager(t, cs, cfg, ns, 3, 2)
	ctx := context.Background()
	ready := func() int {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=ready"})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	waitFor(t, 3*time.Minute, "4 warm pods ready", func() (bool, error) { return ready() >= 4, nil })

	// Every pod's run label, as it changes.
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	runOf := map[string]string{}
	var twice []string
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			po, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if r := po.Labels[LabelRun]; r != "" {
				if prev, ok := runOf[po.Name]; ok && prev != r {
					twice = append(twice, po.Name+": "+prev+" then "+r)
				}
				runOf[po.Name] = r
			}
		}
	}()

	const runs = 40
	type out struct {
		r   runtime.Result
		err error
	}
	results := make(chan out, runs)
	for i := 0; i < runs; i++ {
		m := a
		if i%2 == 1 {
			m = b
		}
		go func() {
			r, err := m.Run(ctx, runtime.Request{Language: runtime.Python, Limits: testLimits(),
				Code: "import os\nprint(os.path.exists('/workspace/.used'))\nopen('/workspace/.used', 'w').close()"})
			results <- out{r, err}
		}()
	}
	warm := 0
	for i := 0; i < runs; i++ {
		o := <-results
		if o.err != nil || o.r.Stdout != "False\n" || o.r.ExitCode != 0 {
			t.Errorf("run: %+v, %v; want a pod no run had used", o.r, o.err)
		}
		if o.r.Warm {
			warm++
		}
	}
	a.WaitTeardowns()
	b.WaitTeardowns()
	w.Stop()
	<-watched
	if len(twice) > 0 {
		t.Errorf("pods taken by two runs: %v", twice)
	}
	if warm == 0 {
		t.Error("no run used a warm pod")
	}
	t.Logf("%d of %d runs warm", warm, runs)
	taken, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=taken"})
	if err != nil || len(taken.Items) != 0 {
		t.Errorf("taken pods left after their runs: %d (%v)", len(taken.Items), err)
	}
}

// A session outlives the airlock that opened it: another instance takes
// it over for its owner only, with the interpreter's state intact; the
// first learns at its next call and lets go without deleting the pod;
// the sweep leaves a served session alone and removes an abandoned one.
func TestSessionTakeover(t *testing.T) {
	cs, ns, a, b := twoManagers(t)
	ctx := context.Background()
	id, sa := openTestSession(t, a)
	py := runPython
	if r, err := py(sa, "x = 41"); err != nil || r.ExitCode != 0 {
		t.Fatalf("first call: %+v %v", r, err)
	}
	if _, _, err := b.AdoptSession(ctx, id, "mallory"); !errors.Is(err, runtime.ErrNoSession) {
		t.Fatalf("another client's takeover: err %v, want ErrNoSession", err)
	}
	sb, rec, err := b.AdoptSession(ctx, id, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Owner != "alice" || rec.Calls != 1 || rec.Idle != 5*time.Minute {
		t.Errorf("record %+v, want owner alice, 1 call, idle 5m", rec)
	}
	if r, err := py(sb, "print(x + 1)"); err != nil || r.Stdout != "42\n" {
		t.Fatalf("after takeover: %+v %v; want the state kept", r, err)
	}
	if _, err := py(sa, "print(x)"); !errors.Is(err, runtime.ErrSessionClosed) {
		t.Fatalf("the old holder's call: err %v, want ErrSessionClosed", err)
	}
	sa.Close()
	a.WaitTeardowns()
	if r, err := py(sb, "print(x)"); err != nil || r.Stdout != "41\n" {
		t.Fatalf("after the old holder let go: %+v %v; want the pod kept", r, err)
	}
	if n, err := SweepSessions(ctx, cs, ns, time.Now(), time.Minute); err != nil || n != 0 {
		t.Fatalf("sweep of a served session: %d %v, want 0", n, err)
	}
	if n, err := SweepSessions(ctx, cs, ns, time.Now().Add(time.Hour), 0); err != nil || n != 1 {
		t.Fatalf("sweep an hour on: %d %v, want the abandoned session deleted", n, err)
	}
	if _, err := py(sb, "print(x)"); !errors.Is(err, runtime.ErrSessionClosed) {
		t.Fatalf("call on a swept session: err %v, want ErrSessionClosed", err)
	}
	sb.Close()
	b.WaitTeardowns()
}

// At shutdown a session goes to an airlock that stays, with its state,
// and outlives its first holder's Close (a rolling update); an airlock
// that leaves last ends the sessions nobody holds; and one that is alone
// ends its own.
func TestSessionHandoff(t *testing.T) {
	cs, ns, a, b := twoManagers(t)
	_, cfg := needCluster(t)
	ctx := context.Background()
	open := func(m *Manager) (string, runtime.SessionReleaser) {
		t.Helper()
		id, s := openTestSession(t, m)
		return id, s.(runtime.SessionReleaser)
	}
	py := func(s runtime.Session, code string) string {
		t.Helper()
		r, err := runPython(s, code)
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %+v %v", code, r, err)
		}
		return r.Stdout
	}
	// The session's pod, nil when gone or going.
	sessionPod := func(id string) *corev1.Pod {
		t.Helper()
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelSession + "=" + id})
		if err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp == nil {
				return &list.Items[i]
			}
		}
		return nil
	}

	id1, sa := open(a)
	py(sa, "x = 41")
	sa.Release()
	a.WaitTeardowns()
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	po := sessionPod(id1)
	if po == nil {
		t.Fatal("the session handed on was deleted with its first airlock")
	}
	if h, held := po.Labels[LabelInstance]; held {
		t.Errorf("the session handed on is still held by %s", h)
	}
	sb, _, err := b.AdoptSession(ctx, id1, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if got := py(sb, "print(x + 1)"); got != "42\n" {
		t.Fatalf("after the handoff: %q, want the state kept", got)
	}

	// b hands it to c, which is staying; then c leaves too, and b, the
	// last to leave, ends it.
	c := newTestManager(t, cs, cfg, ns, 2, 0)
	sb.(runtime.SessionReleaser).Release()
	if sessionPod(id1) == nil {
		t.Fatal("the session handed to c was deleted")
	}
	if err := c.markLeaving(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if sessionPod(id1) != nil {
		t.Error("the last airlock to leave did not end the session nobody holds")
	}

	// c, alone now, ends its own session rather than handing it on.
	id3, sc := open(c)
	sc.Release()
	c.WaitTeardowns()
	if sessionPod(id3) != nil {
		t.Error("an airlock with nobody to hand on to kept its session")
	}
}

// A namespace ResourceQuota without room, and a pod no node can take, are
// infrastructure errors that name the size and the fix, not hangs; the
// unschedulable pod counts for the breaker; neither leaves a pod behind.
func TestAdmissionErrors(t *testing.T) {
	cs, cfg := needCluster(t)
	ctx := context.Background()
	run := func(m *Manager, lim runtime.Limits) error {
		_, err := m.Run(ctx, runtime.Request{Language: runtime.Shell, Code: "echo hi", Limits: lim})
		return err
	}
	t.Run("quota without room", func(t *testing.T) {
		ns := testNamespace(t, cs)
		q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "small"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceLimitsMemory: resource.MustParse("100Mi")}}}
		if _, err := cs.CoreV1().ResourceQuotas(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Until the controller has counted the namespace, admission refuses
		// with "status unknown", not with the quota's verdict.
		waitFor(t, time.Minute, "the quota counted", func() (bool, error) {
			got, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, "small", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			_, ok := got.Status.Hard[corev1.ResourceLimitsMemory]
			return ok, nil
		})
		m := newTestManager(t, cs, cfg, ns, 1, 0)
		err := run(m, testLimits())
		t.Logf("quota: %v", err)
		var infra *runtime.InfraError
		if !errors.As(err, &infra) || !strings.Contains(err.Error(), "ResourceQuota has no room for a sandbox of 256 MiB") {
			t.Fatalf("err %v; want an infrastructure error naming the quota and the size", err)
		}
		m.WaitTeardowns()
		if n := instancePods(t, cs, ns, m); n != 0 {
			t.Errorf("%d pods of this instance left", n)
		}
	})
	t.Run("no node can take it", func(t *testing.T) {
		ns := testNamespace(t, cs)
		m := newTestManagerWith(t, cs, cfg, ns, 1, 0, func(o *Options) {
			o.ScheduleTimeout = 3 * time.Second
			o.Breaker = runtime.BreakerOptions{Failures: 1, Window: time.Hour, Cooldown: time.Hour}
		})
		huge := testLimits()
		huge.MemoryBytes = 1 << 40
		err := run(m, huge)
		t.Logf("unschedulable: %v", err)
		var infra *runtime.InfraError
		if !errors.As(err, &infra) || !strings.Contains(err.Error(), "no node can take a sandbox of 1048576 MiB") || !strings.Contains(err.Error(), "Insufficient memory") {
			t.Fatalf("err %v; want an infrastructure error with the size and the scheduler's reason", err)
		}
		var open *runtime.CircuitOpenError
		if err := run(m, testLimits()); !errors.As(err, &open) {
			t.Fatalf("the next run: err %v; want the breaker open after the pod that never ran", err)
		}
		m.WaitTeardowns()
		if n := instancePods(t, cs, ns, m); n != 0 {
			t.Errorf("%d pods of this instance left", n)
		}
	})
}
