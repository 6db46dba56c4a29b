// Package boot brings up airlock's runtime from its configuration: the
// instance registration, the containerd daemon (embedded or external), the
// client, the image, the shim choice and the sandbox manager. Close unwinds
// them in reverse order.
package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/daemon"
	"github.com/airlock-mcp/airlock/backend/local/instance"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/image"
	"github.com/airlock-mcp/airlock/runtime/network"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Stack is a running runtime. Close it on every exit path.
type Stack struct {
	Config   config.Config
	Instance *instance.Instance
	// Deployment is the id of this state_dir's deployment: it labels every
	// sandbox and scopes every sweep.
	Deployment string
	hold       *instance.Hold
	Daemon     *daemon.Daemon // nil when an external containerd is used
	Client     *containerd.Client
	Manager    *local.ContainerdManager
	Shim       string
	// Egress is the operator's policy when this instance offers networked
	// runs, else nil.
	Egress *egress.Policy
	// Secrets are the operator's secrets and Tripwires says networked runs
	// get fake credentials (both for the tool handlers to bind per call).
	Secrets   *egress.Secrets
	Tripwires bool
	// net is the sandbox network's manager, when networked runs are offered.
	net     *network.Manager
	log     *slog.Logger
	closers []func(context.Context)
	// lastOut stops what instances share (daemon, firewall, bridge); the
	// instance runs it when it leaves as the last one alive.
	lastOut []func(context.Context)
}

// Need says how much of the stack a command needs.
type Need int

// What a command needs brought up.
const (
	NeedClient  Need = iota // daemon and client (image and gc commands)
	NeedManager             // everything, ready to run sandboxes
)

// Up brings the stack up to need. On error, what was acquired is released.
func Up(ctx context.Context, cfg config.Config, need Need, log *slog.Logger) (s *Stack, err error) {
	if !config.IsRoot() {
		return nil, errors.New("airlock must run as root to create sandboxes (for desktop clients, see `airlock connect` in the README)")
	}
	s = &Stack{Config: cfg, log: log}
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
			s = nil
		}
	}()
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return s, fmt.Errorf("create state_dir: %w", err)
	}
	if s.Deployment, err = instance.DeploymentID(cfg.StateDir); err != nil {
		return s, err
	}
	// Released last, after the last instance out removed what the
	// deployment shares: until then no other deployment may take it.
	s.closers = append(s.closers, func(context.Context) { _ = s.hold.Close() })
	inst, err := instance.Register(cfg.StateDir)
	if err != nil {
		return s, err
	}
	s.Instance = inst
	s.closers = append(s.closers, func(ctx context.Context) {
		if err := inst.Leave(ctx, func(ctx context.Context) {
			for i := len(s.lastOut) - 1; i >= 0; i-- {
				s.lastOut[i](ctx)
			}
		}); err != nil {
			log.Warn("unregister instance", "err", err)
		}
	})

	addr := cfg.Containerd.Address
	if addr == "" {
		d, err := daemon.Acquire(ctx, daemon.Options{StateDir: cfg.StateDir, Binary: cfg.Containerd.Binary, Log: log})
		if err != nil {
			return s, fmt.Errorf("embedded containerd: %w", err)
		}
		s.Daemon = d
		addr = d.Address
		s.lastOut = append(s.lastOut, func(ctx context.Context) {
			if err := d.Stop(ctx); err != nil {
				log.Warn("stop embedded containerd", "err", err)
			}
		})
	}
	res := instance.Resources{StateDir: cfg.StateDir, Containerd: addr, Namespace: cfg.Containerd.Namespace, PID: os.Getpid()}
	if cfg.NetworkOffered() {
		res.Bridge, res.Subnet, res.Table = cfg.Network.Bridge, cfg.Network.Subnet, cfg.Network.Table
	}
	if s.hold, err = instance.Claim(ctx, instance.DefaultRegistry, s.Deployment, inst.ID, res); err != nil {
		return s, fmt.Errorf("another airlock deployment on this host: %w", err)
	}
	client, err := containerd.New(addr, containerd.WithDefaultNamespace(cfg.Containerd.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return s, fmt.Errorf("connect to containerd at %s: %w", addr, err)
	}
	s.Client = client
	s.closers = append(s.closers, func(context.Context) { _ = client.Close() })
	// runsc keeps a state root per deployment; the last instance out removes
	// it once no sandbox of the deployment is left (before the daemon stops,
	// after this stack's client is closed: it asks with one of its own).
	s.lastOut = append(s.lastOut, func(ctx context.Context) {
		c, err := containerd.New(addr, containerd.WithTimeout(10*time.Second))
		if err != nil {
			log.Warn("remove runsc root", "err", err)
			return
		}
		defer c.Close()
		if _, err := local.RemoveRunscRoot(ctx, c, cfg.Containerd.Namespace, s.Deployment); err != nil {
			log.Warn("remove runsc root", "err", err)
		}
	})
	// The deployment's parent cgroups go last of what sandboxes used: a
	// sandbox's own cgroup inside one keeps it.
	s.lastOut = append(s.lastOut, func(context.Context) {
		if err := local.RemoveDeploymentCgroups(s.Deployment); err != nil {
			log.Warn("remove deployment cgroups", "err", err)
		}
	})

	if err := s.prepareNetworkSweep(); err != nil {
		return s, err
	}
	s.Sweep(ctx)
	if need == NeedClient {
		return s, nil
	}

	img, err := image.Ensure(namespaces.WithNamespace(ctx, cfg.Containerd.Namespace), client, cfg.Image)
	if err != nil {
		return s, err
	}
	base, err := s.ManagerOptions(img, log)
	if err != nil {
		return s, err
	}
	if cfg.NetworkOffered() {
		es, err := s.upNetwork(ctx, cfg)
		switch {
		case errors.Is(err, ErrProxyTaken):
			log.Warn("all egress proxy ports are taken by other airlock instances; this one offers network none only (raise the range or stop an instance)")
		case err != nil:
			return s, err
		default:
			base.Network, base.Proxy, base.CABundle, base.ProxyPort = es.net, es.proxy, es.caBundle, es.port
			s.Egress = &es.policy
			s.Secrets, s.Tripwires = es.secrets, es.tripwires
		}
	}
	shim := cfg.Runtime.Shim
	if shim == config.ShimAuto {
		shim, err = DetectShim(ctx, base)
		if err != nil {
			return s, err
		}
	}
	base.Shim = shim
	m, err := local.NewContainerd(ctx, base)
	if err != nil {
		return s, err
	}
	s.Shim = shim
	s.Manager = m
	if s.Daemon != nil {
		// The embedded containerd is ours to keep alive.
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Daemon.Supervise(sctx, m.RuntimeDown, func() { go m.RuntimeRestarted(sctx) })
		}()
		s.closers = append(s.closers, func(context.Context) {
			stop()
			<-done
		})
	}
	metrics.SetCircuitOpen(m.Breaker().Open)
	metrics.SetPoolReady(func() map[string]int {
		if m.Pool() == nil {
			return nil
		}
		none, allowlist := m.Pool().Ready()
		return map[string]int{config.NetworkNone: none, config.NetworkAllowlist: allowlist}
	})
	s.closers = append(s.closers, func(ctx context.Context) {
		if err := m.Close(ctx); err != nil {
			log.Warn("remove sandboxes", "err", err)
		}
	})
	return s, nil
}

// ManagerOptions are the sandbox manager's options for this stack's
// configuration, client and instance, with img as the image. The shim and
// the network are left for the caller.
func (s *Stack) ManagerOptions(img containerd.Image, log *slog.Logger) (local.Options, error) {
	cfg := s.Config
	runsc, err := exec.LookPath(cfg.Runtime.Runsc)
	if err != nil {
		return local.Options{}, fmt.Errorf("find runsc %q (run `airlock doctor`): %w", cfg.Runtime.Runsc, err)
	}
	runsc, _ = filepath.Abs(runsc)
	return local.Options{
		Client:          s.Client,
		Namespace:       cfg.Containerd.Namespace,
		Image:           img,
		Runsc:           runsc,
		RunscFlags:      cfg.Runtime.RunscFlags,
		DirectFS:        cfg.Runtime.DirectFS,
		Monitor:         cfg.Monitor.Enabled,
		KillOn:          cfg.Monitor.KillOn,
		InstanceID:      s.Instance.ID,
		DeploymentID:    s.Deployment,
		StateDir:        cfg.StateDir,
		UID:             uint32(cfg.Sandbox.UID),
		GID:             uint32(cfg.Sandbox.GID),
		Env:             cfg.Sandbox.Env,
		Concurrency:     cfg.Limits.Concurrency,
		Queue:           cfg.Limits.Queue,
		QueueWait:       cfg.Limits.QueueWait(),
		PoolSize:        cfg.Pool.Size,
		PoolLimits:      cfg.Limits.RunLimits(0),
		PoolMaxIdle:     cfg.Pool.MaxIdleAge,
		CheckpointBytes: int64(cfg.Sessions.CheckpointMB) << 20,
		Restore:         cfg.Pool.Restore,
		PoolPreload:     cfg.Pool.Preload,
		Breaker:         runtime.BreakerOptions{Failures: cfg.Breaker.Failures, Window: cfg.Breaker.Window, Cooldown: cfg.Breaker.Cooldown},
		Log:             log,
	}, nil
}

// Close releases the stack in reverse order of acquisition.
func (s *Stack) Close(ctx context.Context) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i](ctx)
	}
	s.closers = nil
}

// HandOff gives up this stack without tearing anything down: the
// process is about to exit and its guardian, told by the kernel, removes
// the instance's sandboxes, networks and registration, and what instances
// share when it was the last. Exiting closes the rest.
func (s *Stack) HandOff() {
	if s != nil {
		s.closers = nil
	}
}

// ShimPreference is the order shims are tried in: gVisor's own first.
var ShimPreference = []string{local.ShimRunsc, local.ShimRunc}

// DetectShim finds the shim that starts a sandbox on this host, preferring
// gVisor's own. The answer is cached in state_dir, keyed by the runsc binary,
// so only the first start pays for the probe.
func DetectShim(ctx context.Context, o local.Options) (string, error) {
	key := cacheKey(o.Runsc)
	cache := filepath.Join(o.StateDir, "shim.detected")
	if b, err := os.ReadFile(cache); err == nil {
		if k, shim, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok && k == key {
			return shim, nil
		}
	}
	var errs []error
	for _, shim := range ShimPreference {
		if err := ProbeShim(ctx, o, shim); err != nil {
			o.Log.Info("shim does not work on this host", "shim", shim, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", shim, err))
			continue
		}
		_ = os.WriteFile(cache, []byte(key+" "+shim+"\n"), 0o600)
		o.Log.Info("detected working shim", "shim", shim)
		return shim, nil
	}
	return "", fmt.Errorf("no shim starts a gVisor sandbox on this host (run `airlock doctor`): %w", errors.Join(errs...))
}

// ProbeShim runs `true` in a sandbox with shim and reports why it failed, if it did.
func ProbeShim(ctx context.Context, o local.Options, shim string) error {
	o.Shim = shim
	o.Concurrency = 1
	o.PoolSize = 0
	m, err := local.NewContainerd(ctx, o)
	if err != nil {
		return err
	}
	defer m.Close(context.WithoutCancel(ctx))
	lim := runtime.Limits{Timeout: 20 * time.Second, MemoryBytes: 128 << 20, CPUs: 1, Pids: 32, StdoutBytes: 1024, StderrBytes: 4096, WorkspaceBytes: 1 << 20, TmpBytes: 1 << 20}
	res, err := m.Run(ctx, runtime.Request{Language: runtime.Shell, Code: "echo airlock-probe", Limits: lim})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "airlock-probe") {
		return fmt.Errorf("probe exited %d: %s", res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return nil
}

// Sweep removes what instances of this deployment that died left behind,
// in order: their sandboxes, then runsc processes no container owns, then
// cgroups nothing uses, then their network namespaces and addresses, then
// their stdio pipes. It reports how many sandboxes it removed; what fails
// is logged, and the next sweep tries again.
func (s *Stack) Sweep(ctx context.Context) int {
	cfg := s.Config
	ns := cfg.Containerd.Namespace
	nctx := namespaces.WithNamespace(ctx, ns)
	removed := 0
	for _, sweep := range []struct {
		what string
		run  func() (int, error)
	}{
		{"orphaned sandboxes", func() (int, error) {
			n, err := local.RemoveSandboxes(nctx, s.Client, ns, s.Deployment, s.deadInstance)
			removed = n
			return n, err
		}},
		{"orphaned sandbox tasks", func() (int, error) { return local.RemoveOrphanTasks(ctx, s.Client, ns) }},
		{"orphaned sandbox snapshots", func() (int, error) {
			return local.RemoveOrphanSnapshots(ctx, s.Client, ns, s.Deployment, s.deadInstance)
		}},
		{"orphaned sandbox processes", func() (int, error) {
			return local.RemoveOrphanSandboxProcesses(ctx, s.Client, ns, s.Deployment)
		}},
		{"stale sandbox cgroups", func() (int, error) { return local.RemoveStaleCgroups(ctx, s.Client, ns, s.Deployment) }},
	} {
		if n, err := sweep.run(); err != nil {
			s.log.Warn("remove "+sweep.what, "err", err)
		} else if n > 0 {
			s.log.Info("removed "+sweep.what, "count", n)
		}
	}
	if s.net != nil {
		if err := s.net.GC(ctx, func(id string) bool { return !s.deadInstance(id) }); err != nil {
			s.log.Warn("remove network of dead instances", "err", err)
		}
	}
	s.removeDeadInstanceDirs()
	return removed
}

// prepareNetworkSweep readies the sandbox network's manager, when this
// deployment offers networked runs, so that sweeps can free dead
// instances' namespaces and addresses. Whichever instance leaves last
// removes the firewalls and bridges any instance recorded, whatever it
// came up for itself.
func (s *Stack) prepareNetworkSweep() error {
	s.lastOut = append(s.lastOut, func(context.Context) { removeSharedNetworks(s.Config.StateDir, s.log) })
	if !s.Config.NetworkOffered() {
		return nil
	}
	ncfg, err := NetworkConfig(s.Config, s.Instance.ID)
	if err != nil {
		return err
	}
	nm, err := network.New(ncfg)
	if err != nil {
		return err
	}
	c := nm.Config()
	if err := recordSharedNetwork(s.Config.StateDir, sharedNetwork{Bridge: c.Bridge, Subnet: c.Subnet.String(), Table: c.Table}); err != nil {
		return err
	}
	s.net = nm
	return nil
}

// deadInstance reports whether id names another instance that is no longer
// running: what it left behind is garbage.
func (s *Stack) deadInstance(id string) bool {
	return id != s.Instance.ID && !instance.Alive(s.Config.StateDir, id)
}

// removeDeadInstanceDirs removes the stdio pipe and runtime monitoring
// dirs of instances that died.
func (s *Stack) removeDeadInstanceDirs() {
	for _, parent := range []string{filepath.Join(s.Config.StateDir, "fifo"), local.MonitorDir(s.Config.StateDir), local.TemplatesDir(s.Config.StateDir)} {
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if s.deadInstance(e.Name()) {
				_ = os.RemoveAll(filepath.Join(parent, e.Name()))
			}
		}
	}
}

func cacheKey(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return "none"
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().Unix())
}

// Ready reports whether the stack can serve runs now: containerd answers,
// the image is there, and the sandbox manager is up.
func (s *Stack) Ready(ctx context.Context) error {
	if s.Manager == nil {
		return errors.New("sandbox runtime not started")
	}
	serving, err := s.Client.IsServing(ctx)
	if err != nil || !serving {
		return fmt.Errorf("containerd not serving: %v", err)
	}
	if _, err := s.Client.GetImage(namespaces.WithNamespace(ctx, s.Config.Containerd.Namespace), s.Config.Image); err != nil {
		return fmt.Errorf("image %s: %w", s.Config.Image, err)
	}
	return nil
}
