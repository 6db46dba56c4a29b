package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/image"
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
	// LabelDeployment names the deployment (one state_dir) whose instance
	// made it: sweeps touch only their own deployment's sandboxes, never
	// those of another airlock sharing the daemon.
	LabelDeployment = "airlock.deployment"
	LabelRun        = "airlock.run"
	// LabelPool is "warming" on a pooled sandbox being made ready, "idle"
	// once it waits in the pool, and "taken" once a run has it.
	LabelPool = "airlock.pool"
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
	// DirectFS is runsc's --directfs (runc shim only); see
	// config.RuntimeConfig.DirectFS.
	DirectFS bool
	// Monitor starts every sandbox with gVisor's runtime monitoring
	// reporting to this instance (runc shim only); KillOn are the kinds
	// that end a run at once (runtime.ReasonPolicyViolation).
	Monitor    bool
	KillOn     []string
	InstanceID string
	// DeploymentID labels every sandbox, and scopes every sweep.
	DeploymentID string
	StateDir     string
	UID, GID     uint32
	Env          map[string]string
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
	// PoolSize is how many warm sandboxes to keep ready per network mode;
	// 0 turns the pool off. PoolLimits are the limits pooled sandboxes are
	// made with; a request with other spec limits gets a cold sandbox.
	// PoolMaxIdle retires a warm sandbox that waited longer.
	PoolSize    int
	PoolLimits  runtime.Limits
	PoolMaxIdle time.Duration
	// PoolPreload are the Python modules a warm sandbox has imported.
	PoolPreload []string
	// Breaker stops sandbox creation while it keeps failing.
	Breaker runtime.BreakerOptions
	// Restore makes pooled sandboxes, and cold ones with PoolLimits, by
	// restoring a checkpoint of a warm one (runc shim only).
	Restore bool
	// CheckpointBytes bounds the disk paused sessions' checkpoints take;
	// past it the oldest paused sessions end. 0: no bound.
	CheckpointBytes int64
}

// ContainerdManager runs each request in a new gVisor sandbox via containerd.
type ContainerdManager struct {
	o           Options
	runtimeOpts any
	netOpts     any // runtime options of networked runs
	admission   *runtime.Admission
	oomMu       sync.Mutex
	oom         map[string]bool
	stopEvents  context.CancelFunc
	fifoDir     string
	// watch receives runtime monitoring events; nil when it is off.
	watch   *watcher
	pool    *Pool
	breaker *runtime.Breaker
	// restarts counts containerd going down and coming back.
	restarts atomic.Uint64
	// trips are the networked runs and sessions a tripwire can kill.
	trips runtime.Targets[*sandbox]
	// live are the sandboxes this manager holds, by container id.
	liveMu sync.Mutex
	live   map[string]*sandbox
	// teardowns are sandboxes being destroyed after their run answered.
	teardowns runtime.Teardowns
	// runsc's hash, for checkpoint manifests, computed once.
	runscOnce sync.Once
	runscSum  string
	runscErr  error
	// tmpl is the template sandboxes are restored from.
	tmpl templates
	// paused are the paused sessions this process serves, by id.
	pausedMu sync.Mutex
	paused   map[string]*session
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
		admission: runtime.NewAdmission(o.Concurrency, o.Queue, o.QueueWait),
		oom:       map[string]bool{},
		fifoDir:   FIFODir(o.StateDir, o.InstanceID),
		breaker:   runtime.NewBreaker(o.Breaker),
		live:      map[string]*sandbox{},
		paused:    map[string]*session{},
	}
	if err := os.MkdirAll(m.fifoDir, 0o700); err != nil {
		return nil, fmt.Errorf("create fifo dir: %w", err)
	}
	if o.Proxy != nil {
		o.Proxy.OnTripwire(m.tripwire)
	}
	switch o.Shim {
	case ShimRunc:
		// runsc_flags come last, so an explicit --directfs there wins.
		flags := append([]string{"--directfs=" + strconv.FormatBool(o.DirectFS)}, o.RunscFlags...)
		monitorDir := ""
		if o.Monitor {
			monitorDir = MonitorDir(o.StateDir)
		}
		wrapper, err := WriteRunscWrapper(o.StateDir, o.Runsc, flags, false, monitorDir)
		if err != nil {
			return nil, err
		}
		netWrapper, err := WriteRunscWrapper(o.StateDir, o.Runsc, flags, true, monitorDir)
		if err != nil {
			return nil, err
		}
		// runsc's state under a root of the deployment's own: every runsc
		// process names it (--root), which is how a sweep tells its own
		// orphans from another deployment's sandboxes.
		root := RunscRoot(o.DeploymentID)
		m.runtimeOpts = &options.Options{BinaryName: wrapper, Root: root}
		m.netOpts = &options.Options{BinaryName: netWrapper, Root: root}
		if o.Monitor {
			if m.watch, err = newWatcher(m); err != nil {
				return nil, err
			}
		}
	case ShimRunsc:
		// gVisor's shim finds runsc on containerd's PATH and takes no options here.
	default:
		return nil, fmt.Errorf("runtime: unknown shim %q", o.Shim)
	}
	evCtx, cancel := context.WithCancel(namespaces.WithNamespace(context.WithoutCancel(ctx), o.Namespace))
	m.stopEvents = cancel
	go m.watchOOM(evCtx)
	if o.Shim == ShimRunc {
		go m.sweepCheckpointsEvery(evCtx, checkpointSweepEvery)
	}
	if o.PoolSize > 0 {
		m.pool = newPool(m, o.PoolSize, o.PoolLimits, o.PoolMaxIdle)
	}
	return m, nil
}

// runscRootBase holds one runsc state root per deployment; on tmpfs, so a
// reboot leaves no stale state.
const runscRootBase = "/run/airlock/runsc"

// RunscRoot is runsc's state root for deployment's sandboxes.
func RunscRoot(deployment string) string { return filepath.Join(runscRootBase, deployment) }

// MonitorDir holds a directory per instance with its runtime monitoring
// socket and the configs of the sandboxes it is creating.
func MonitorDir(stateDir string) string { return filepath.Join(stateDir, "monitor") }

// FIFODir is where an instance's sandbox stdio pipes live. It is per
// instance so that Close and GC remove exactly their own.
func FIFODir(stateDir, instanceID string) string {
	return filepath.Join(stateDir, "fifo", instanceID)
}

// WriteRunscWrapper writes the executable the runc shim runs in place of runc:
// runsc with airlock's global flags. It returns the wrapper's path.
//
// The wrapper's name carries a hash of its text, so managers that share a
// state_dir with different flags (another airlock's directfs, the
// benchmark's modes) each run their own, and none rewrites a wrapper
// another is using.
//
// A networked wrapper gives runsc its own network stack over the namespace
// airlock prepared; the other has none at all.
//
// With monitorDir set, a runsc call whose last argument is a container id
// with a runtime monitoring config at monitorDir/<instance>/<id>.json (the
// create of that container: airlock writes the file just before and removes
// it after) also gets --pod-init-config, so the sandbox reports to the
// instance that made it. The wrapper is the same for every instance of the
// state_dir; the file says which listener.
func WriteRunscWrapper(stateDir, runsc string, flags []string, networked bool, monitorDir string) (string, error) {
	if !filepath.IsAbs(runsc) {
		return "", fmt.Errorf("runsc path %q must be absolute", runsc)
	}
	dir := filepath.Join(stateDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create wrapper dir: %w", err)
	}
	// No network stack at all unless the run has an egress policy; the empty
	// network namespace is a second, independent barrier.
	mode, name := "--network=none", "runsc-airlock-"
	if networked {
		mode, name = "--network=sandbox", "runsc-airlock-net-"
	}
	var cmd strings.Builder
	cmd.WriteString(shellQuote(runsc))
	for _, f := range append([]string{mode}, flags...) {
		cmd.WriteString(" " + shellQuote(f))
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Written by airlock: runsc with airlock's flags, run by containerd's runc shim.\n")
	if monitorDir != "" {
		fmt.Fprintf(&b, `id=
for a; do id=$a; done
case $id in
airlock-*[!0-9a-z-]*) ;;
airlock-*)
  for f in %s/*/"$id".json; do
    [ -f "$f" ] && exec %s --pod-init-config="$f" "$@"
  done ;;
esac
`, shellQuote(monitorDir), cmd.String())
	}
	b.WriteString("exec " + cmd.String() + " \"$@\"\n")
	sum := sha256.Sum256([]byte(b.String()))
	p := filepath.Join(dir, name+hex.EncodeToString(sum[:6]))
	if cur, err := os.ReadFile(p); err == nil && string(cur) == b.String() {
		return p, nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", p, os.Getpid())
	if err := os.WriteFile(tmp, []byte(b.String()), 0o755); err != nil {
		return "", fmt.Errorf("write runsc wrapper: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
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

// Snapshotter is the containerd snapshotter sandboxes use: the one images
// are unpacked for.
const Snapshotter = image.Snapshotter

// WaitTeardowns waits until the sandboxes of finished runs are destroyed.
func (m *ContainerdManager) WaitTeardowns() { m.teardowns.Wait() }

// Pool is the warm pool, nil when it is off.
func (m *ContainerdManager) Pool() *Pool { return m.pool }

// Breaker is the circuit breaker in front of sandbox creation.
func (m *ContainerdManager) Breaker() *runtime.Breaker { return m.breaker }

// Admission is the manager's concurrency limit, for metrics and tests.
func (m *ContainerdManager) Admission() *runtime.Admission { return m.admission }

// Close implements Manager: it stops the pool, waits for teardowns in
// flight, and removes every sandbox of this instance.
func (m *ContainerdManager) Close(ctx context.Context) error {
	if m.pool != nil {
		m.pool.stop()
	}
	m.teardowns.Wait()
	m.stopEvents()
	_, err := RemoveSandboxes(ctx, m.o.Client, m.o.Namespace, m.o.DeploymentID, func(inst string) bool { return inst == m.o.InstanceID })
	if rerr := os.RemoveAll(m.fifoDir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("remove fifo dir: %w", rerr))
	}
	err = errors.Join(err, m.removeTemplates())
	if m.watch != nil {
		err = errors.Join(err, m.watch.close())
	}
	return err
}

// RemoveSandboxes deletes deployment's containers (with tasks and
// snapshots) whose owning instance id matches doomed, and returns how many
// it removed. Another deployment's are never listed.
func RemoveSandboxes(ctx context.Context, client *containerd.Client, namespace, deployment string, doomed func(instance string) bool) (int, error) {
	return removeContainers(ctx, client, namespace, deployment, func(_, instance string) bool { return doomed(instance) })
}

// removeContainers deletes deployment's containers for which doomed(id,
// owning instance) holds.
func removeContainers(ctx context.Context, client *containerd.Client, namespace, deployment string, doomed func(id, instance string) bool) (int, error) {
	if deployment == "" {
		return 0, errors.New("remove sandboxes: no deployment id")
	}
	ctx = namespaces.WithNamespace(ctx, namespace)
	containers, err := client.Containers(ctx, fmt.Sprintf("labels.%q,labels.%q==%s", LabelInstance, LabelDeployment, deployment))
	if err != nil {
		return 0, fmt.Errorf("list sandboxes: %w", err)
	}
	// In parallel: a killed instance's pool and sessions are removed within
	// seconds, not one sandbox teardown after another.
	var (
		mu   sync.Mutex
		errs []error
		n    int
		wg   sync.WaitGroup
		sem  = make(chan struct{}, removeParallel)
	)
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil || !doomed(c.ID(), labels[LabelInstance]) {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := removeContainer(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			n++
		}()
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

// RemoveOrphanSnapshots deletes the deployment's sandbox snapshots whose
// instance doomed says is gone and that no container holds. Creating a
// sandbox prepares its snapshot before its container exists; a server
// that dies between the two (a stdio client closing as the pool warms)
// leaves a snapshot the container sweep never sees.
func RemoveOrphanSnapshots(ctx context.Context, client *containerd.Client, namespace, deployment string, doomed func(instance string) bool) (int, error) {
	if deployment == "" {
		return 0, errors.New("remove snapshots: no deployment id")
	}
	ctx = namespaces.WithNamespace(ctx, namespace)
	sn := client.SnapshotService(Snapshotter)
	var keys []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if inst := info.Labels[LabelInstance]; inst != "" && doomed(inst) {
			keys = append(keys, info.Name)
		}
		return nil
	}, fmt.Sprintf("labels.%q==%s", LabelDeployment, deployment))
	if err != nil {
		return 0, fmt.Errorf("list sandbox snapshots: %w", err)
	}
	n := 0
	var errs []error
	for _, k := range keys {
		if _, err := client.LoadContainer(ctx, k); err == nil {
			continue // its container's removal takes it
		}
		if err := sn.Remove(ctx, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove snapshot %s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// removeParallel is how many sandboxes a sweep removes at once.
const removeParallel = 8

// removeContainer deletes c with its task and snapshot.
func removeContainer(ctx context.Context, c containerd.Container) error {
	var errs []error
	if t, err := c.Task(ctx, nil); err == nil {
		if err := deleteTask(ctx, t); err != nil {
			errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return errors.Join(append(errs, fmt.Errorf("delete container %s: %w", c.ID(), err))...)
	}
	return errors.Join(errs...)
}
