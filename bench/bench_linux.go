package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/image"
)

// Modes, in the order rows are reported.
const (
	ModeNative  = "native"
	ModeRunc    = "runc"
	ModeCold    = "gvisor-cold"
	ModeWarm    = "gvisor-warm"
	ModeMCPCold = "mcp-cold"
	ModeMCPWarm = "mcp-warm"
	// ModeRestore is a cold sandbox (no pool) restored from the template,
	// not booted; ModeWarmRestore the pool refilled by restoring it
	// (pool.restore); ModeResume a paused session's next call.
	ModeRestore     = "gvisor-restore"
	ModeWarmRestore = "gvisor-warm-restore"
	ModeResume      = "session-resume"
)

// AllModes are every mode, floor first.
var AllModes = []string{ModeNative, ModeRunc, ModeCold, ModeRestore, ModeWarm, ModeWarmRestore, ModeResume, ModeMCPCold, ModeMCPWarm}

// The safety variants: gvisor-cold and gvisor-warm with runtime monitoring
// off, or with runsc's directfs on, each compared with the configured
// defaults (monitoring on, directfs off) to show what those defaults cost.
const (
	ModeColdNoMonitor = "gvisor-cold-nomonitor"
	ModeWarmNoMonitor = "gvisor-warm-nomonitor"
	ModeColdDirectFS  = "gvisor-cold-directfs"
	ModeWarmDirectFS  = "gvisor-warm-directfs"
)

// SafetyModes are `--modes safety`: the defaults and their variants.
var SafetyModes = []string{ModeCold, ModeColdNoMonitor, ModeColdDirectFS, ModeWarm, ModeWarmNoMonitor, ModeWarmDirectFS}

// variant is how a safety mode differs from the configuration.
type variant struct {
	noMonitor, directFS bool
	// restore makes sandboxes by restoring the template (pool.restore).
	restore bool
}

// variants maps every local gVisor mode to its variant.
var variants = map[string]struct {
	warm bool
	v    variant
}{
	ModeCold:          {false, variant{}},
	ModeRestore:       {false, variant{restore: true}},
	ModeWarm:          {true, variant{}},
	ModeWarmRestore:   {true, variant{restore: true}},
	ModeColdNoMonitor: {false, variant{noMonitor: true}},
	ModeWarmNoMonitor: {true, variant{noMonitor: true}},
	ModeColdDirectFS:  {false, variant{directFS: true}},
	ModeWarmDirectFS:  {true, variant{directFS: true}},
}

// Options say what to measure.
type Options struct {
	Modes       []string `json:"modes"`
	Programs    string   `json:"programs"`
	Concurrency []int    `json:"concurrency"`
	// Iterations is how many runs are timed per row, and again how many
	// the throughput phase runs.
	Iterations int `json:"iterations"`
	// IdleSandboxes is how many warm sandboxes the memory measurement
	// holds at once.
	IdleSandboxes int `json:"idle_sandboxes"`
	// Binary is the airlock executable the MCP modes start.
	Binary string `json:"-"`
	// Kubeconfig names the cluster of the Kubernetes modes.
	Kubeconfig string       `json:"-"`
	Log        *slog.Logger `json:"-"`
}

// Report is everything one benchmark run found.
type Report struct {
	Started  time.Time `json:"started"`
	Took     string    `json:"took"`
	Machine  Machine   `json:"machine"`
	Options  Options   `json:"options"`
	ComputeN int       `json:"compute_loop_n"`
	Results  []Result  `json:"results"`
	// Memory of idle pooled sandboxes: with the default preload, and with
	// none, to show what the preloaded modules cost.
	Memory  []Memory `json:"memory,omitempty"`
	Targets []Target `json:"targets"`
	// Costs of the safe defaults, when the safety variants ran.
	Costs []Cost `json:"costs,omitempty"`
	// Egress is the proxy's HTTPS latency: direct, tunnelled, intercepted.
	Egress []EgressLatency `json:"egress,omitempty"`
}

// Machine says where the numbers were taken.
type Machine struct {
	Cores    int    `json:"cores"`
	CPU      string `json:"cpu"`
	Kernel   string `json:"kernel"`
	MemTotal string `json:"mem_total"`
	Go       string `json:"go"`
	Shim     string `json:"shim"`
	// Monitor and DirectFS are the configuration the gvisor-* modes ran
	// with (the safety variants change one each).
	Monitor  bool   `json:"monitor"`
	DirectFS bool   `json:"directfs"`
	Image    string `json:"image"`
	Python   string `json:"native_python"`
}

// Run measures every mode in o on stack s.
func Run(ctx context.Context, s *boot.Stack, o Options) (*Report, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	rep := &Report{Started: time.Now().UTC(), Options: o, Machine: machine(s)}
	rootfs := filepath.Join(s.Config.StateDir, "images", "rootfs-"+image.DefaultRecipe("").Hash())
	if _, err := os.Stat(filepath.Join(rootfs, "usr/bin/python3")); err != nil {
		return nil, fmt.Errorf("the image's unpacked rootfs is missing (%s): run `airlock image build`", rootfs)
	}
	rep.Machine.Python = "chroot " + rootfs + " /usr/bin/python3"
	n, err := calibrate(ctx, rootfs)
	if err != nil {
		return nil, fmt.Errorf("calibrate the compute loop: %w", err)
	}
	rep.ComputeN = n
	progs, err := Select(Programs(n), o.Programs)
	if err != nil {
		return nil, err
	}
	maxC := slices.Max(o.Concurrency)
	var kenv *kubeEnv
	if slices.ContainsFunc(o.Modes, isKube) {
		if kenv, err = newKubeEnv(ctx, o.Kubeconfig, s.Config.Kubernetes); err != nil {
			return nil, err
		}
		defer kenv.close()
	}
	for _, mode := range o.Modes {
		r, err := newRunner(ctx, s, kenv, mode, rootfs, maxC, o)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		for _, p := range progs {
			for _, c := range o.Concurrency {
				if isKube(mode) && c > 1 {
					// Each pod requests the CPU it may use; the test node's
					// two CPUs hold two sandboxes of the default 1 CPU.
					continue
				}
				res := measure(ctx, r, mode, p, c, o.Iterations)
				o.Log.Info("bench", "mode", mode, "program", p.Name, "concurrency", c, "p50_ms", res.P50, "p95_ms", res.P95,
					"throughput", fmt.Sprintf("%.2f/s", res.Throughput), "cpu_per_run_ms", res.CPUPerRun, "warm", res.WarmFraction, "errors", res.Errors)
				rep.Results = append(rep.Results, res)
				if ctx.Err() != nil {
					r.Close()
					return nil, ctx.Err()
				}
			}
		}
		r.Close()
	}
	if o.IdleSandboxes > 0 {
		// The configured preload, and none for comparison (once, when the
		// configuration preloads nothing).
		preloads := [][]string{s.Config.Pool.Preload}
		if len(s.Config.Pool.Preload) > 0 {
			preloads = append(preloads, []string{})
		}
		for _, preload := range preloads {
			mem, err := measureIdle(ctx, s, o.IdleSandboxes, preload)
			if err != nil {
				o.Log.Warn("memory of idle sandboxes not measured", "preload", preload, "err", err)
				continue
			}
			o.Log.Info("bench memory", "preload", preload, "pss_mib", mem.PerSandboxPSS, "idle", mem.Idle)
			rep.Memory = append(rep.Memory, mem)
		}
	}
	// The proxy's cost is measured in-process: a few hundred loopback
	// requests, seconds in all.
	if rep.Egress, err = MeasureEgress(ctx, max(50, 4*o.Iterations)); err != nil {
		o.Log.Warn("egress proxy latency not measured", "err", err)
	}
	rep.Targets = targets(rep)
	rep.Costs = costs(rep)
	rep.Took = time.Since(rep.Started).Round(time.Second).String()
	return rep, nil
}

// measure times one row: a latency phase of rounds of c simultaneous runs
// (warm modes start each round with c warm sandboxes ready), then a
// throughput phase of c workers running back to back, whose CPU is counted
// until the pool has refilled.
func measure(ctx context.Context, r Runner, mode string, p Program, c, iterations int) Result {
	res := Result{Mode: mode, Program: p.Name, Concurrency: c}
	var mu sync.Mutex
	var lat []time.Duration
	steps := map[string][]float64{}
	warm := 0
	record := func(s Sample, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			return
		}
		lat = append(lat, s.Latency)
		for k, v := range s.Steps {
			steps[k] = append(steps[k], v)
		}
		if s.Warm {
			warm++
		}
	}
	for len(lat)+res.Errors < iterations && ctx.Err() == nil {
		if err := r.Ready(ctx, c); err != nil {
			record(Sample{}, err)
			continue
		}
		var wg sync.WaitGroup
		for range c {
			wg.Add(1)
			go func() {
				defer wg.Done()
				record(r.Run(ctx, p))
			}()
		}
		wg.Wait()
	}
	summarize(&res, lat)
	summarizeSteps(&res, steps)
	if len(lat) > 0 {
		res.WarmFraction = float64(warm) / float64(len(lat))
	}

	// Throughput: c workers share iterations runs.
	_ = r.Ready(ctx, c)
	t0, errT := cpuTicks()
	start := time.Now()
	var next, done int
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= iterations {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				if _, err := r.Run(ctx, p); err == nil {
					mu.Lock()
					done++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	// What the runs cost includes putting the pool back as it was.
	_ = r.Ready(ctx, c)
	t1, errT1 := cpuTicks()
	if done > 0 && errT == nil && errT1 == nil {
		res.Throughput = float64(done) / wall.Seconds()
		res.CPUPerRun = float64(t1-t0) / ticksPerSecond * 1000 / float64(done)
		if res.CPUPerRun > 0 {
			limit := float64(goruntime.NumCPU()) / (res.CPUPerRun / 1000)
			res.Efficiency = res.Throughput / limit
		}
	}
	return res
}

// newRunner makes the runner of a mode; cold and warm runners get room for
// maxC runs at once, and warm ones a pool of maxC.
func newRunner(ctx context.Context, s *boot.Stack, kenv *kubeEnv, mode, rootfs string, maxC int, o Options) (Runner, error) {
	switch mode {
	case ModeK8sCold, ModeK8sWarm:
		return newKubeRunner(ctx, s, kenv, mode == ModeK8sWarm, 1)
	case ModeMCPK8sCold, ModeMCPK8sWarm:
		pool := 0
		var ready func(context.Context, string, int) error
		if mode == ModeMCPK8sWarm {
			pool = 1
			ready = func(ctx context.Context, _ string, n int) error { return kenv.ready(ctx, n) }
		}
		return newMCPRunner(ctx, o.Binary, s.Config.StateDir, pool, 1, ready, kenv)
	case ModeNative:
		return &native{rootfs: rootfs}, nil
	case ModeRunc:
		if _, err := exec.LookPath("runc"); err != nil {
			return nil, errors.New("runc is not installed (scripts/install-deps.sh --bench installs Debian's)")
		}
		ctx = namespaces.WithNamespace(ctx, s.Config.Containerd.Namespace)
		img, err := s.Client.GetImage(ctx, s.Config.Image)
		if err != nil {
			return nil, err
		}
		fifo := local.FIFODir(s.Config.StateDir, s.Instance.ID)
		if err := os.MkdirAll(fifo, 0o700); err != nil {
			return nil, err
		}
		return &runcRunner{client: s.Client, namespace: s.Config.Containerd.Namespace, image: img,
			limits: s.Config.Limits.RunLimits(0), fifoDir: fifo, instance: s.Instance.ID}, nil
	case ModeResume:
		m, lim, err := newManager(ctx, s, 0, maxC, s.Config.Pool.Preload, variant{restore: true})
		if err != nil {
			return nil, err
		}
		return newSessionRunner(ctx, m, lim, maxC)
	case ModeCold, ModeWarm, ModeColdNoMonitor, ModeWarmNoMonitor, ModeColdDirectFS, ModeWarmDirectFS, ModeRestore, ModeWarmRestore:
		if v := variants[mode].v; (v.noMonitor || v.directFS || v.restore) && s.Shim != local.ShimRunc {
			return nil, fmt.Errorf("runtime monitoring, directfs and restores go through the runc shim's runsc wrapper; shim %s has none", s.Shim)
		}
		pool := 0
		if variants[mode].warm {
			pool = maxC
		}
		m, lim, err := newManager(ctx, s, pool, maxC, s.Config.Pool.Preload, variants[mode].v)
		if err != nil {
			return nil, err
		}
		return localRunner(m, lim), nil
	case ModeMCPCold, ModeMCPWarm:
		pool := 0
		var ready func(context.Context, string, int) error
		if mode == ModeMCPWarm {
			pool = maxC
			ready = func(ctx context.Context, instance string, n int) error {
				// As for gvisor-warm: n warm sandboxes waiting, and the last
				// round's sandboxes torn down.
				for {
					ids, err := idleIDs(ctx, s, instance)
					if err != nil {
						return err
					}
					busy, err := takenIDs(ctx, s, instance)
					if err != nil {
						return err
					}
					if len(ids) >= n && len(busy) == 0 {
						return nil
					}
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		}
		return newMCPRunner(ctx, o.Binary, s.Config.StateDir, pool, maxC, ready, nil)
	default:
		return nil, fmt.Errorf("unknown mode %q (modes: %s)", mode, strings.Join(slices.Concat(AllModes, []string{ModeColdNoMonitor, ModeWarmNoMonitor, ModeColdDirectFS, ModeWarmDirectFS}, KubeModes), ", "))
	}
}

// newManager starts a sandbox manager of its own on the stack's containerd.
func newManager(ctx context.Context, s *boot.Stack, pool, concurrency int, preload []string, v variant) (*local.ContainerdManager, runtime.Limits, error) {
	nctx := namespaces.WithNamespace(ctx, s.Config.Containerd.Namespace)
	img, err := s.Client.GetImage(nctx, s.Config.Image)
	if err != nil {
		return nil, runtime.Limits{}, err
	}
	o, err := s.ManagerOptions(img, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, runtime.Limits{}, err
	}
	lim := s.Config.Limits.RunLimits(0)
	o.Shim = s.Shim
	o.Concurrency, o.Queue, o.QueueWait = concurrency, concurrency, time.Minute
	o.PoolSize, o.PoolLimits, o.PoolMaxIdle, o.PoolPreload = pool, lim, time.Hour, preload
	if v.noMonitor {
		o.Monitor = false
	}
	if v.directFS {
		o.DirectFS = true
	}
	o.Restore = v.restore
	m, err := local.NewContainerd(nctx, o)
	return m, lim, err
}

// calibrate finds the loop count that takes about 200 ms natively.
func calibrate(ctx context.Context, rootfs string) (int, error) {
	n := &native{rootfs: rootfs}
	const probe = 1_000_000
	p := Program{Name: "calibrate", Lang: "python", Code: computeCode(probe), Want: computeWant(probe)}
	best := time.Duration(1 << 62)
	for range 3 {
		s, err := n.Run(ctx, p)
		if err != nil {
			return 0, err
		}
		best = min(best, s.Latency)
	}
	base, err := n.Run(ctx, Program{Name: "print", Lang: "python", Code: "print(1)", Want: "1\n"})
	if err != nil {
		return 0, err
	}
	loop := best - base.Latency
	if loop <= 0 {
		loop = best
	}
	return int(float64(probe) * float64(200*time.Millisecond) / float64(loop)), nil
}

func machine(s *boot.Stack) Machine {
	m := hostMachine()
	m.Shim, m.Image = s.Shim, s.Config.Image
	m.Monitor, m.DirectFS = s.Config.Monitor.Enabled, s.Config.Runtime.DirectFS
	return m
}

// hostMachine is what the benchmarks report of the host itself.
func hostMachine() Machine {
	m := Machine{Cores: goruntime.NumCPU(), Go: goruntime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		l, _, _ := strings.Cut(string(b), "\n")
		m.MemTotal = strings.Join(strings.Fields(l)[1:], " ")
	}
	return m
}
