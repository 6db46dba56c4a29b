package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/exchange"
	"github.com/airlock-mcp/airlock/runtime/network"
)

// sandbox is one gVisor sandbox whose init is the driver: created, started
// and (for the pool) warmed ahead of its run, used once, destroyed.
type sandbox struct {
	m         *ContainerdManager
	id        string // container and snapshot id: "airlock-" + sid
	sid       string
	container containerd.Container
	task      containerd.Task
	exited    chan struct{} // closed when the task has exited; status then set
	status    containerd.ExitStatus
	stdin     *io.PipeWriter
	stdout    *io.PipeWriter
	diag      *runtime.CappedBuffer // the driver's own stderr
	att       *network.Attachment
	// logp is the sandbox's logger; a pooled sandbox's gains the run id
	// when a run takes it, so every line of a run names it.
	logp atomic.Pointer[slog.Logger]

	st *exchange.Stream
	// spec is the OCI spec the sandbox runs with; a checkpoint keeps it.
	spec *specs.Spec

	mu        sync.Mutex
	cleanups  []func(context.Context)
	destroyed bool

	// created and steps time the making of the sandbox, for Trace.
	created time.Time
	steps   map[string]float64
	// pooled says the sandbox is made ahead for the warm pool; restored,
	// that it was restored from the template, not booted.
	pooled, restored bool
	// attempts are what runtime monitoring saw the code try (nil when it
	// is off); violated is set at the first of a monitor.kill_on kind.
	attempts *runtime.Attempts
	violated atomic.Bool
	// tripped is set when the proxy saw one of the run's tripwires.
	tripped atomic.Bool
}

// step records how long the making of the sandbox has taken so far.
func (s *sandbox) step(name string) {
	s.steps[name] = runtime.Millis(time.Since(s.created))
}

// create makes and starts a sandbox with id "airlock-"+sid. A networked one
// is attached to its network namespace before it starts (runsc reads the
// namespace once). On error, everything acquired is released.
func (m *ContainerdManager) create(ctx context.Context, sid string, preload, networked bool, lim runtime.Limits) (s *sandbox, err error) {
	err = m.breaker.Guard(ctx, func() error {
		s, err = m.build(ctx, sid, preload, networked, lim, nil)
		return err
	})
	return s, err
}

// build is create without the breaker. With from set, the sandbox is
// restored from that checkpoint with its spec instead of booted; its driver
// then says hello only when asked (driver.FrameAttach).
func (m *ContainerdManager) build(ctx context.Context, sid string, preload, networked bool, lim runtime.Limits, from *restorePoint) (_ *sandbox, err error) {
	ctx = namespaces.WithNamespace(ctx, m.o.Namespace)
	id := "airlock-" + sid
	s := &sandbox{m: m, id: id, sid: sid,
		st: exchange.NewStream(), exited: make(chan struct{}),
		created: time.Now(), steps: map[string]float64{}, pooled: preload}
	lg := m.o.Log.With("sandbox", id)
	if !preload {
		lg = lg.With("run", sid)
	}
	s.logp.Store(lg)
	// Tracked until the very end of its teardown: a sandbox whose teardown
	// failed (containerd down) is then found and removed by reconcile.
	m.track(s)
	s.onDestroy(func(context.Context) { m.untrack(s) })
	defer func() {
		// Whatever was acquired goes, in reverse order.
		if err != nil {
			s.destroy()
		}
	}()
	policy := SpecPolicy{UID: m.o.UID, GID: m.o.GID, Preload: preload, PreloadModules: m.o.PoolPreload, Limits: lim, CgroupsPath: CgroupsPath(m.o.DeploymentID, id)}
	// No shim grouping (io.containerd.runc.v2.group), though it would save
	// a shim process per sandbox: with runsc under it, deleted sandboxes
	// left their cgroups behind, and a create could reach a group's shim
	// as it exited.
	runtimeOpts := m.runtimeOpts
	var proxyEnv map[string]string
	if networked {
		att, err := m.o.Network.Attach(ctx, sid)
		if err != nil {
			return nil, runtime.Infra("attach sandbox network", err)
		}
		s.att = att
		s.onDestroy(func(cctx context.Context) {
			if err := m.o.Network.Detach(cctx, att); err != nil {
				s.log().Error("detach sandbox network", "err", err)
			}
		})
		policy.NetNSPath = att.NetNSPath
		proxyEnv = runtime.ProxyEnv(m.proxyURL(), len(m.o.CABundle) > 0)
		runtimeOpts = m.netOpts
	}
	policy.Env = runtime.BuildEnv(m.o.Env, proxyEnv)
	spec, err := Spec(policy)
	if err != nil {
		return nil, err
	}
	var taskOpts []containerd.NewTaskOpts
	if from != nil {
		// runsc restores only into the spec it checkpointed; the cgroup is
		// the one thing that is this sandbox's own.
		spec = from.specFor(policy.CgroupsPath)
		taskOpts = append(taskOpts, containerd.WithRestoreImagePath(from.image))
	}
	s.spec = spec
	labels := map[string]string{LabelInstance: m.o.InstanceID, LabelDeployment: m.o.DeploymentID, LabelRun: sid}
	if preload {
		labels[LabelPool] = "warming"
	}
	container, err := m.o.Client.NewContainer(ctx, id,
		containerd.WithImage(m.o.Image),
		containerd.WithSnapshotter(Snapshotter),
		containerd.WithNewSnapshot(id, m.o.Image, snapshots.WithLabels(labels)),
		containerd.WithRuntime(m.o.Shim, runtimeOpts),
		containerd.WithSpec(spec),
		containerd.WithContainerLabels(labels),
	)
	if err != nil {
		// The snapshot is prepared before the container is made, and
		// containerd's client leaves it when the second step fails.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		if rerr := m.o.Client.SnapshotService(Snapshotter).Remove(cctx, id); rerr != nil && !errdefs.IsNotFound(rerr) {
			s.log().Warn("remove the snapshot of a sandbox not created", "err", rerr)
		}
		cancel()
		return nil, runtime.Infra("create sandbox", err)
	}
	s.step("container")
	s.container = container
	s.onDestroy(func(cctx context.Context) {
		if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			s.log().Error("delete sandbox", "err", err)
		}
	})

	s.diag = runtime.NewCappedBuffer(8<<10, nil)
	if m.watch != nil {
		done, err := m.watch.prepare(s)
		if err != nil {
			return nil, runtime.Infra("prepare runtime monitoring", err)
		}
		defer done()
	}
	var task containerd.Task
	var stdoutR *io.PipeReader
	for attempt := 1; ; attempt++ {
		// Fresh pipes each try: the streams of a failed try are closed,
		// and their copiers must not take a frame meant for this one.
		var stdinR *io.PipeReader
		var stdinW, stdoutW *io.PipeWriter
		stdinR, stdinW = io.Pipe()
		stdoutR, stdoutW = io.Pipe()
		task, err = container.NewTask(ctx, cio.NewCreator(cio.WithStreams(stdinR, stdoutW, s.diag), cio.WithFIFODir(m.fifoDir)), taskOpts...)
		if err == nil {
			s.stdin, s.stdout = stdinW, stdoutW
			s.st.SetInput(stdinW)
			s.onDestroy(func(context.Context) {
				stdinW.Close()
				stdoutW.Close()
			})
			break
		}
		stdinW.Close()
		stdoutW.Close()
		if attempt >= shimAttempts || !shimWentAway(err) || ctx.Err() != nil {
			return nil, runtime.Infra("create sandbox task", err)
		}
		// A shim that exits as the create reaches it (a crash, or a shim
		// shared with a sandbox just deleted) fails it: the next try starts
		// a new one.
		s.log().Debug("shim went away during create; retrying", "attempt", attempt, "err", err)
		time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
	}
	s.step("task")
	s.task = task
	// The exit wait has no deadline of its own: the run's timer bounds it.
	exitCh, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		if _, derr := task.Delete(context.WithoutCancel(ctx)); derr != nil {
			s.log().Error("delete sandbox task", "err", derr)
		}
		return nil, runtime.Infra("wait for sandbox task", err)
	}
	go func() {
		s.status = <-exitCh
		close(s.exited)
	}()
	s.onDestroy(func(cctx context.Context) {
		// A driver that reported its exit is about to end on its own; give
		// it a moment, then make sure.
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
			if err := task.Kill(cctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
				s.log().Warn("kill sandbox", "err", err)
			}
			select {
			case <-s.exited:
			case <-cctx.Done():
				s.log().Error("sandbox did not stop after SIGKILL")
			}
		}
		// deleteTask, not Delete: s.exited also closes when the exit wait
		// broke (containerd restarted) with the sandbox still running, and
		// a plain Delete of a running task fails and leaks it for good.
		if err := deleteTask(cctx, task); err != nil {
			s.log().Error("delete sandbox task", "err", err)
		}
		task.IO().Close()
	})
	go s.st.Decode(stdoutR, func(driver.Hello) { s.started() }, s.log())
	// The caller cannot cut the start short: the shim goes on with a
	// start or restore whose request was cancelled, and a task that came
	// up after its caller gave up had no one to wait for its exit (a
	// dropped HTTP call left such sandboxes running). A cancelled call
	// tears down its started sandbox as usual.
	sctx, cancelStart := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	defer cancelStart()
	if err := task.Start(sctx); err != nil {
		if from != nil {
			// A task whose restore failed mostly never ran: it is deleted
			// (and killed first if it did run). The teardown's kill would
			// wait for an exit that never comes.
			if derr := deleteTask(sctx, task); derr != nil {
				s.log().Warn("delete task of a failed restore", "err", derr)
			}
		}
		return nil, runtime.Infra("start sandbox", err)
	}
	if s.violated.Load() {
		s.killNow() // a monitor.kill_on attempt came before the task was there
	}
	s.step("started")
	return s, nil
}

// startTimeout bounds a sandbox's start or restore.
const startTimeout = 2 * time.Minute

// shimAttempts bounds the tries to create a task whose shim went away.
const shimAttempts = 4

// shimWentAway reports whether a task create failed because the shim it
// reached was exiting: the error crosses containerd's API as text.
func shimWentAway(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "ttrpc: closed") || strings.Contains(msg, "ttrpc: client shutting down")
}

// log is the sandbox's logger.
func (s *sandbox) log() *slog.Logger { return s.logp.Load() }

// takenBy names the run that took a pooled sandbox in its log lines.
func (s *sandbox) takenBy(runID string) {
	s.logp.Store(s.m.o.Log.With("sandbox", s.id, "run", runID))
}

// onDestroy adds a cleanup step; steps run in reverse order.
func (s *sandbox) onDestroy(f func(context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

// started observes the sandbox's start time when its driver says hello.
func (s *sandbox) started() {
	kind := "cold"
	if s.pooled {
		kind = "pool"
	}
	metrics.SandboxStart.WithLabelValues(kind).Observe(time.Since(s.created).Seconds())
}

// waitHello waits for the driver's first frame.
func (s *sandbox) waitHello(ctx context.Context) (driver.Hello, error) {
	return s.st.WaitHello(ctx, s.diagText)
}

func (s *sandbox) diagText() string {
	d, _ := s.diag.Result()
	return d
}

// run runs one piece of work (exchange.Run) in the sandbox.
func (s *sandbox) run(ctx context.Context, req runtime.Request, files map[string][]byte, session bool) (runtime.Result, error) {
	r := &localRun{s: s}
	r.memBefore, r.counted = memoryCounters(s.m.o.DeploymentID, s.id)
	return exchange.Run(ctx, r, req, files, session)
}

// localRun is one run's view of a sandbox for exchange.Run: its memory
// counts when the run began tell an out-of-memory exit from another.
type localRun struct {
	s         *sandbox
	memBefore memoryCounts
	counted   bool
}

func (r *localRun) Stream() *exchange.Stream { return r.s.st }
func (r *localRun) Exited() <-chan struct{}  { return r.s.exited }
func (r *localRun) Diag() string             { return r.s.diagText() }
func (r *localRun) Log() *slog.Logger        { return r.s.log() }

func (r *localRun) Stop(kill bool) error {
	s := r.s
	kctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), s.m.o.Namespace), cleanupTimeout)
	defer cancel()
	if kill {
		if err := s.task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			s.log().Warn("kill sandbox", "err", err)
		}
	}
	select {
	case <-s.exited:
		return nil
	case <-kctx.Done():
		return runtime.Infra("sandbox did not stop after SIGKILL", kctx.Err())
	}
}

func (r *localRun) ExitStatus() (int, error) {
	code, _, err := r.s.status.Result()
	return int(code), err
}

func (r *localRun) OutOfMemory(exit int, d time.Duration) bool {
	return r.s.outOfMemory(exit, r.memBefore, r.counted, d)
}

// destroy releases everything the sandbox holds, in reverse order, once;
// it runs even when the caller has given up.
func (s *sandbox) destroy() {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return
	}
	s.destroyed = true
	cleanups := s.cleanups
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), s.m.o.Namespace), cleanupTimeout)
	defer cancel()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i](ctx)
	}
}

// acquire gives sandbox id its sandbox: a pooled one when one fits (warm),
// else one restored from the template, else a booted one.
func (m *ContainerdManager) acquire(ctx context.Context, id string, networked bool, lim runtime.Limits) (s *sandbox, warm bool, err error) {
	if m.pool != nil && m.pool.fits(lim) {
		if s = m.pool.take(ctx, networked, id); s != nil {
			return s, true, nil
		}
	}
	if t := m.templateFor(networked, lim); t != nil {
		if s, _ = m.restoreWarm(ctx, t, id, false, lim); s != nil {
			return s, false, nil
		}
		// The restore failed: the sandbox boots.
	}
	s, err = m.create(ctx, id, false, networked, lim)
	return s, false, err
}

// Run implements Manager: it takes a warm sandbox from the pool when one
// fits, or makes a cold one; runs the code; answers; and destroys the
// sandbox after answering, holding the run's slot until it is gone.
func (m *ContainerdManager) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	gen := m.restarts.Load()
	res, err := m.run(ctx, req)
	return res, m.restartedDuring(gen, err)
}

func (m *ContainerdManager) run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if req.RunID == "" {
		req.RunID = runtime.NewRunID()
	}
	res := runtime.Result{RunID: req.RunID}
	if req.Language != runtime.Python && req.Language != runtime.Shell {
		return res, fmt.Errorf("unknown language %q", req.Language)
	}
	// Before a sandbox is taken for it (exchange.Run checks again).
	if err := runtime.CheckOverlay(req.Env, req.HomeFiles); err != nil {
		return res, err
	}
	networked := req.Egress != nil
	if networked && (m.o.Network == nil || m.o.Proxy == nil) {
		return res, errors.New("runtime: this server offers no network (network.allow_domains is empty)")
	}
	called := time.Now()
	release, err := m.admission.Acquire(ctx)
	if err != nil {
		return res, err
	}
	log := m.o.Log.With("run", req.RunID)
	start := time.Now()
	s, warm, err := m.acquire(ctx, req.RunID, networked, req.Limits)
	if err != nil {
		release()
		return res, err
	}
	defer m.teardowns.Start(s.destroy, release)
	startRun := time.Now()
	var files map[string][]byte
	if networked {
		forget := m.trips.Arm(req.RunID, s)
		unregister := m.o.Proxy.Register(s.att.IP, req.RunID, *req.Egress)
		s.onDestroy(func(context.Context) { unregister(); forget() })
		files = runtime.ProxyFiles(m.proxyURL(), m.o.CABundle)
	}
	if warm && s.attempts != nil {
		s.attempts.Take() // the warm-up's, not the run's
	}
	exchanged := time.Now()
	res, err = s.run(ctx, req, files, false)
	noted := time.Now()
	err = m.noteAttempts(s, &res, err, false)
	err = noteTripwire(s, &res, err, false)
	res.Warm = warm
	if res.Timings != nil {
		// The steps of the call's path, each as long as it took (Trace).
		res.Timings["admission"] = runtime.Millis(start.Sub(called))
		res.Timings["acquired_sandbox"] = runtime.Millis(startRun.Sub(start))
		res.Timings["exchange"] = runtime.Millis(noted.Sub(exchanged))
		res.Timings["attempts"] = runtime.Millis(time.Since(noted))
		if !warm {
			for k, v := range s.steps {
				res.Timings["create."+k] = v
			}
		}
	}
	if networked {
		res.EgressDenied = m.o.Proxy.Denials(req.RunID)
	}
	log.Info("run finished", "lang", req.Language, "warm", warm, "restored", s.restored, "exit", res.ExitCode, "reason", res.Reason, "took", res.Duration, "total", time.Since(start))
	return res, err
}

func (m *ContainerdManager) proxyURL() string {
	if m.o.Network == nil {
		return ""
	}
	return fmt.Sprintf("http://%s:%d", m.o.Network.Config().Gateway(), m.o.ProxyPort)
}

// outOfMemory reports whether a run whose code ended with exit code exit
// ran out of memory, given its sandbox's memory counts when it began (see
// ranOutOfMemory). The counts are read at once and are final when read
// after the code died; containerd's event, which can trail the exit by
// seconds on a busy host, decides only where they cannot be read, and is
// waited for (up to d) only after a kill by signal 9.
func (s *sandbox) outOfMemory(exit int, before memoryCounts, counted bool, d time.Duration) bool {
	if counted {
		if after, ok := memoryCounters(s.m.o.DeploymentID, s.id); ok {
			// The event, if any, is consumed so it cannot be taken for a
			// later run's.
			return s.m.takeOOM(s.id) || ranOutOfMemory(exit, before, after)
		}
	}
	if exit != 128+int(syscall.SIGKILL) {
		return s.m.takeOOM(s.id)
	}
	return s.m.waitOOM(s.id, d)
}

// waitOOM reports whether containerd said the sandbox ran out of memory,
// waiting up to d for the event.
func (m *ContainerdManager) waitOOM(id string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if m.takeOOM(id) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
