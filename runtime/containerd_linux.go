package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/airlock-mcp/airlock/runtime/network"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Shim names, as containerd knows them.
const (
	ShimRunc  = "io.containerd.runc.v2"
	ShimRunsc = "io.containerd.runsc.v1"
)

// Labels put on every container and snapshot airlock creates, so that
// Close and GC find exactly their own.
const (
	LabelInstance = "airlock.instance"
	LabelRun      = "airlock.run"
)

// cleanupTimeout bounds teardown, which runs even after the caller gave up.
const cleanupTimeout = 30 * time.Second

// Options configure a ContainerdManager.
type Options struct {
	Client     *containerd.Client
	Namespace  string
	Image      containerd.Image
	Shim       string
	Runsc      string   // absolute path of runsc
	RunscFlags []string // extra global runsc flags (runc shim only)
	InstanceID string
	StateDir   string
	UID, GID   uint32
	Env        map[string]string
	// Concurrency is how many sandboxes may run at once. Past it up to Queue
	// runs wait for a slot, each for at most QueueWait; past that Run returns
	// ErrBusy at once.
	Concurrency int
	Queue       int
	QueueWait   time.Duration
	Log         *slog.Logger
	// Network and Proxy serve runs with an egress policy; both nil when
	// networked runs are not offered.
	Network *network.Manager
	Proxy   *egress.Server
	// ProxyPort is the port Proxy listens on, on the network's gateway.
	ProxyPort int
	// CABundle is PEM the sandbox trusts for TLS (system roots included).
	CABundle []byte
}

// ContainerdManager runs each request in a new gVisor sandbox via containerd.
type ContainerdManager struct {
	o           Options
	runtimeOpts any
	netOpts     any // runtime options of networked runs
	admission   *Admission
	oomMu       sync.Mutex
	oom         map[string]bool
	stopEvents  context.CancelFunc
	fifoDir     string
}

// NewContainerd checks its options and starts watching for OOM events.
func NewContainerd(ctx context.Context, o Options) (*ContainerdManager, error) {
	if o.Client == nil || o.Image == nil {
		return nil, errors.New("runtime: client and image are required")
	}
	if o.Concurrency < 1 {
		o.Concurrency = 1
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	m := &ContainerdManager{
		o:         o,
		admission: NewAdmission(o.Concurrency, o.Queue, o.QueueWait),
		oom:       map[string]bool{},
		fifoDir:   FIFODir(o.StateDir, o.InstanceID),
	}
	if err := os.MkdirAll(m.fifoDir, 0o700); err != nil {
		return nil, fmt.Errorf("create fifo dir: %w", err)
	}
	switch o.Shim {
	case ShimRunc:
		wrapper, err := WriteRunscWrapper(o.StateDir, o.Runsc, o.RunscFlags, false)
		if err != nil {
			return nil, err
		}
		netWrapper, err := WriteRunscWrapper(o.StateDir, o.Runsc, o.RunscFlags, true)
		if err != nil {
			return nil, err
		}
		m.runtimeOpts = &options.Options{BinaryName: wrapper}
		m.netOpts = &options.Options{BinaryName: netWrapper}
	case ShimRunsc:
		// gVisor's shim finds runsc on containerd's PATH and takes no options here.
	default:
		return nil, fmt.Errorf("runtime: unknown shim %q", o.Shim)
	}
	evCtx, cancel := context.WithCancel(namespaces.WithNamespace(context.WithoutCancel(ctx), o.Namespace))
	m.stopEvents = cancel
	go m.watchOOM(evCtx)
	return m, nil
}

// FIFODir is where an instance's sandbox stdio pipes live. It is per
// instance so that Close and GC remove exactly their own.
func FIFODir(stateDir, instanceID string) string {
	return filepath.Join(stateDir, "fifo", instanceID)
}

// WriteRunscWrapper writes the executable the runc shim runs in place of runc:
// runsc with airlock's global flags. It returns the wrapper's path.
//
// A networked wrapper gives runsc its own network stack over the namespace
// airlock prepared; the other has none at all.
func WriteRunscWrapper(stateDir, runsc string, flags []string, networked bool) (string, error) {
	if !filepath.IsAbs(runsc) {
		return "", fmt.Errorf("runsc path %q must be absolute", runsc)
	}
	dir := filepath.Join(stateDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create wrapper dir: %w", err)
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by airlock: runsc with airlock's flags, run by containerd's runc shim.\nexec ")
	b.WriteString(shellQuote(runsc))
	// No network stack at all unless the run has an egress policy; the empty
	// network namespace is a second, independent barrier.
	mode, name := "--network=none", "runsc-airlock"
	if networked {
		mode, name = "--network=sandbox", "runsc-airlock-net"
	}
	for _, f := range append([]string{mode}, flags...) {
		b.WriteString(" " + shellQuote(f))
	}
	b.WriteString(" \"$@\"\n")
	p := filepath.Join(dir, name)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o755); err != nil {
		return "", fmt.Errorf("write runsc wrapper: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("install runsc wrapper: %w", err)
	}
	return p, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (m *ContainerdManager) watchOOM(ctx context.Context) {
	for ctx.Err() == nil {
		ch, errs := m.o.Client.Subscribe(ctx, `topic=="/tasks/oom"`)
	loop:
		for {
			select {
			case <-ctx.Done():
				return
			case env := <-ch:
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				if e, ok := v.(*events.TaskOOM); ok {
					m.oomMu.Lock()
					m.oom[e.ContainerID] = true
					m.oomMu.Unlock()
				}
			case err := <-errs:
				if ctx.Err() == nil {
					m.o.Log.Warn("oom event stream ended; retrying", "err", err)
				}
				break loop
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (m *ContainerdManager) takeOOM(id string) bool {
	m.oomMu.Lock()
	defer m.oomMu.Unlock()
	v := m.oom[id]
	delete(m.oom, id)
	return v
}

// NewRunID returns a random run id.
func NewRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run implements Manager.
func (m *ContainerdManager) Run(ctx context.Context, req Request) (res Result, err error) {
	release, err := m.admission.Acquire(ctx)
	if err != nil {
		return Result{RunID: req.RunID}, err
	}
	defer release()
	if req.RunID == "" {
		req.RunID = NewRunID()
	}
	res.RunID = req.RunID
	log := m.o.Log.With("run", req.RunID)
	args, err := Args(req.Language)
	if err != nil {
		return res, err
	}
	id := "airlock-" + req.RunID
	if req.Egress != nil && (m.o.Network == nil || m.o.Proxy == nil) {
		return res, errors.New("runtime: this server offers no network (network.allow_domains is empty)")
	}
	ctx = namespaces.WithNamespace(ctx, m.o.Namespace)
	// Teardown must finish even when the caller cancelled, and its deadline
	// starts when teardown does, not when the run did.
	var cleanups []func(context.Context)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i](cctx)
		}
	}()

	start := time.Now()
	policy := SpecPolicy{
		Args:        args,
		UID:         m.o.UID,
		GID:         m.o.GID,
		Limits:      req.Limits,
		CgroupsPath: "/airlock/" + id,
	}
	runtimeOpts := m.runtimeOpts
	var files map[string][]byte
	var proxyEnv map[string]string
	if req.Egress != nil {
		// The namespace must be wired before the sandbox starts: runsc reads
		// its interfaces once, at start.
		att, err := m.o.Network.Attach(ctx, req.RunID)
		if err != nil {
			return res, infra("attach sandbox network", err)
		}
		cleanups = append(cleanups, func(cctx context.Context) {
			if err := m.o.Network.Detach(cctx, att); err != nil {
				log.Error("detach sandbox network", "err", err)
			}
		})
		unregister := m.o.Proxy.Register(att.IP, req.RunID, *req.Egress)
		cleanups = append(cleanups, func(context.Context) { unregister() })
		defer func() { res.EgressDenied = m.o.Proxy.Denials(req.RunID) }()
		proxy := fmt.Sprintf("http://%s:%d", att.Gateway, m.o.ProxyPort)
		policy.NetNSPath = att.NetNSPath
		proxyEnv = ProxyEnv(proxy, len(m.o.CABundle) > 0)
		files = ProxyFiles(proxy, m.o.CABundle)
		runtimeOpts = m.netOpts
	}
	policy.Env = BuildEnv(m.o.Env, proxyEnv)
	spec, err := Spec(policy)
	if err != nil {
		return res, err
	}

	labels := map[string]string{LabelInstance: m.o.InstanceID, LabelRun: req.RunID}
	// A writable snapshot of the run's own, so the code can be placed in it;
	// the spec still mounts the root read-only inside the sandbox.
	container, err := m.o.Client.NewContainer(ctx, id,
		containerd.WithImage(m.o.Image),
		containerd.WithSnapshotter(Snapshotter),
		containerd.WithNewSnapshot(id, m.o.Image, snapshots.WithLabels(labels)),
		containerd.WithRuntime(m.o.Shim, runtimeOpts),
		containerd.WithSpec(spec),
		containerd.WithContainerLabels(labels),
	)
	if err != nil {
		return res, infra("create sandbox", err)
	}
	cleanups = append(cleanups, func(cctx context.Context) {
		if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			log.Error("delete sandbox", "err", err)
		}
	})
	if err := m.placeCode(ctx, id, req.Language, req.Code, files); err != nil {
		return res, infra("place code in sandbox", err)
	}

	stdout := newCappedBuffer(req.Limits.StdoutBytes, tap(req.Output, Stdout))
	stderr := newCappedBuffer(req.Limits.StderrBytes, tap(req.Output, Stderr))
	// No stdin: the code reads EOF, as it would from /dev/null.
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, stdout, stderr), cio.WithFIFODir(m.fifoDir)))
	if err != nil {
		return res, infra("create sandbox task", err)
	}
	cleanups = append(cleanups, func(cctx context.Context) {
		if err := deleteTask(cctx, task); err != nil {
			log.Error("delete sandbox task", "err", err)
		}
	})
	// The exit wait has no deadline of its own: the timer below bounds the run.
	exitCh, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return res, infra("wait for sandbox task", err)
	}
	if err := task.Start(ctx); err != nil {
		return res, infra("start sandbox", err)
	}
	log.Debug("sandbox started", "took", time.Since(start))

	timer := time.NewTimer(req.Limits.Timeout)
	defer timer.Stop()
	var status containerd.ExitStatus
	var killedBy string
	select {
	case status = <-exitCh:
	case <-timer.C:
		killedBy = ReasonTimeout
	case <-ctx.Done():
		killedBy = "cancelled"
	}
	if killedBy != "" {
		// SIGKILL the whole sandbox: SIGTERM can be ignored, and a child that
		// escaped the init process's group must not survive it.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := task.Kill(kctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("kill sandbox", "err", err)
		}
		select {
		case status = <-exitCh:
		case <-kctx.Done():
			return res, infra("sandbox did not stop after SIGKILL", kctx.Err())
		}
	}
	res.Duration = time.Since(start)
	code, _, werr := status.Result()
	if werr != nil {
		return res, infra("sandbox exit status", werr)
	}
	// The output pipes close when the sandbox is gone; a bounded wait keeps a
	// misbehaving shim from hanging the call.
	ioDone := make(chan struct{})
	go func() { task.IO().Wait(); close(ioDone) }()
	select {
	case <-ioDone:
	case <-time.After(5 * time.Second):
		log.Warn("sandbox output did not close in time")
	}
	task.IO().Close()

	res.ExitCode = int(code)
	res.Stdout, res.StdoutTruncated = stdout.Result()
	res.Stderr, res.StderrTruncated = stderr.Result()
	if res.StdoutTruncated {
		res.Stdout += fmt.Sprintf(TruncationMarker, req.Limits.StdoutBytes)
	}
	if res.StderrTruncated {
		res.Stderr += fmt.Sprintf(TruncationMarker, req.Limits.StderrBytes)
	}
	oom := m.takeOOM(id)
	switch {
	case killedBy == ReasonTimeout:
		res.TimedOut, res.Reason = true, ReasonTimeout
		if res.ExitCode == 0 {
			res.ExitCode = 128 + int(syscall.SIGKILL)
		}
	case killedBy != "":
		return res, ctx.Err()
	case oom:
		res.OOMKilled, res.Reason = true, ReasonOutOfMemory
	case res.Truncated():
		res.Reason = ReasonOutputCapped
	case res.ExitCode > 128:
		res.Reason = ReasonSignal
	}
	log.Info("run finished", "lang", req.Language, "exit", res.ExitCode, "reason", res.Reason, "took", res.Duration)
	return res, nil
}

// deleteTask removes a task. An exited task is deleted as it is; one still
// running (an early return, a cancelled call) is SIGKILLed as a whole first.
func deleteTask(ctx context.Context, task containerd.Task) error {
	if _, err := task.Delete(ctx); err == nil || errdefs.IsNotFound(err) {
		return nil
	}
	exitCh, err := task.Wait(ctx)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("wait: %w", err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill: %w", err)
	}
	select {
	case <-exitCh:
	case <-ctx.Done():
		return fmt.Errorf("wait for exit after SIGKILL: %w", ctx.Err())
	}
	if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// Snapshotter is the containerd snapshotter sandboxes use, and so the one
// images must be unpacked for: placeCode writes into its upper layer.
const Snapshotter = "overlayfs"

// placeCode writes the run's code into its snapshot's upper layer, as a
// root-owned, world-readable file under CodeDir. It is part of the sandbox's
// read-only root: the code can read it, not change it.
func (m *ContainerdManager) placeCode(ctx context.Context, key string, lang Language, code string, files map[string][]byte) error {
	file, err := CodeFile(lang)
	if err != nil {
		return err
	}
	mounts, err := m.o.Client.SnapshotService(Snapshotter).Mounts(ctx, key)
	if err != nil {
		return fmt.Errorf("snapshot mounts: %w", err)
	}
	upper := ""
	for _, mt := range mounts {
		for _, opt := range mt.Options {
			if v, ok := strings.CutPrefix(opt, "upperdir="); ok {
				upper = v
			}
		}
	}
	if upper == "" {
		return fmt.Errorf("snapshot %s has no overlay upper dir (mounts %+v)", key, mounts)
	}
	dir := filepath.Join(upper, CodeDir)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("create code dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(upper, file), []byte(code), 0o644); err != nil {
		return fmt.Errorf("write code: %w", err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// Admission is the manager's concurrency limit, for metrics and tests.
func (m *ContainerdManager) Admission() *Admission { return m.admission }

// Close implements Manager: it removes every sandbox of this instance.
func (m *ContainerdManager) Close(ctx context.Context) error {
	m.stopEvents()
	_, err := RemoveSandboxes(ctx, m.o.Client, m.o.Namespace, func(inst string) bool { return inst == m.o.InstanceID })
	if rerr := os.RemoveAll(m.fifoDir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove fifo dir: %w", rerr))
	}
	return err
}

// RemoveSandboxes deletes airlock's containers (with tasks and snapshots)
// whose owning instance id matches doomed, and returns how many it removed.
func RemoveSandboxes(ctx context.Context, client *containerd.Client, namespace string, doomed func(instance string) bool) (int, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	containers, err := client.Containers(ctx, "labels.\""+LabelInstance+"\"")
	if err != nil {
		return 0, fmt.Errorf("list sandboxes: %w", err)
	}
	var errs []error
	n := 0
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil || !doomed(labels[LabelInstance]) {
			continue
		}
		if t, err := c.Task(ctx, nil); err == nil {
			if err := deleteTask(ctx, t); err != nil {
				errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
			}
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", c.ID(), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
