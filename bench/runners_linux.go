package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/runtime"
)

// Runner runs one program once and says how long it took as its caller
// sees it.
type Runner interface {
	Run(ctx context.Context, p Program) (Sample, error)
	// Ready waits until n runs could start warm (a no-op for modes without
	// a pool).
	Ready(ctx context.Context, n int) error
	Close()
}

// Sample is one measured run.
type Sample struct {
	Latency time.Duration
	Warm    bool
	// Steps are the run's own timings (runtime.Result.Timings), where the
	// runner can see them.
	Steps map[string]float64
}

// checkOutput fails a run whose output is not what the program prints.
func checkOutput(p Program, stdout string, exit int) error {
	if exit != 0 || stdout != p.Want {
		return fmt.Errorf("%s: exit %d, stdout %q, want %q", p.Name, exit, clip(stdout), p.Want)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// sandboxEnv is what the native and runc modes run with, as the sandbox
// would.
func sandboxEnv() []string {
	return runtime.BuildEnv()
}

// native runs the image's own interpreter from the unpacked rootfs with
// chroot, as uid 1000: the floor every sandbox is compared with.
type native struct {
	rootfs string
}

func (n *native) Run(ctx context.Context, p Program) (Sample, error) {
	argv := []string{"/usr/bin/python3", "-c", p.Code}
	if p.Lang == "shell" {
		argv = []string{"/bin/bash", "-c", p.Code}
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = sandboxEnv()
	cmd.Dir = "/workspace"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: n.rootfs, Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	err := cmd.Run()
	lat := time.Since(start)
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return Sample{}, err
		}
		code = ee.ExitCode()
	}
	return Sample{Latency: lat}, checkOutput(p, out.String(), code)
}

func (n *native) Ready(context.Context, int) error { return nil }
func (n *native) Close()                           {}

// manager runs through airlock's runtime: cold (no pool) or warm.
type manager struct {
	m      runtime.Manager
	limits runtime.Limits
	// ready waits until n runs could start warm and the last round's
	// sandboxes are gone.
	ready func(ctx context.Context, n int) error
	close func()
}

func (r *manager) Run(ctx context.Context, p Program) (Sample, error) {
	start := time.Now()
	res, err := r.m.Run(ctx, runtime.Request{Language: runtime.Language(p.Lang), Code: p.Code, Limits: r.limits, Trace: true})
	lat := time.Since(start)
	if err != nil {
		return Sample{}, err
	}
	return Sample{Latency: lat, Warm: res.Warm, Steps: res.Timings}, checkOutput(p, res.Stdout, res.ExitCode)
}

func (r *manager) Ready(ctx context.Context, n int) error { return r.ready(ctx, n) }
func (r *manager) Close()                                 { r.close() }

// localRunner runs a containerd manager.
func localRunner(m *local.ContainerdManager, lim runtime.Limits) *manager {
	return &manager{m: m, limits: lim, close: func() { _ = m.Close(context.Background()) },
		ready: func(ctx context.Context, n int) error {
			if err := m.WaitTemplate(ctx); err != nil {
				return err
			}
			pool := m.Pool()
			if pool == nil {
				m.WaitTeardowns()
				return nil
			}
			for {
				if ready, _ := pool.Ready(); ready >= n {
					// Let the machine settle: teardowns of the last round run too.
					m.WaitTeardowns()
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		}}
}

// runcRunner starts a runc container from the same image through the same
// containerd, running the interpreter directly: what most sandboxes built
// on containers do.
type runcRunner struct {
	client    *containerd.Client
	namespace string
	image     containerd.Image
	limits    runtime.Limits
	fifoDir   string
	instance  string
}

func (r *runcRunner) Run(ctx context.Context, p Program) (Sample, error) {
	ctx = namespaces.WithNamespace(ctx, r.namespace)
	id := "airlock-bench-runc-" + runtime.NewRunID()
	argv := []string{"/usr/bin/python3", "-c", p.Code}
	if p.Lang == "shell" {
		argv = []string{"/bin/bash", "-c", p.Code}
	}
	spec, err := local.Spec(local.SpecPolicy{UID: 1000, GID: 1000, Limits: r.limits, Env: sandboxEnv(), CgroupsPath: "/airlock/" + id})
	if err != nil {
		return Sample{}, err
	}
	// The plain program as uid 1000, no capabilities: no driver here.
	spec.Process.Args = argv
	spec.Process.User.UID, spec.Process.User.GID = 1000, 1000
	spec.Process.Capabilities.Bounding = []string{}
	spec.Process.Capabilities.Effective = []string{}
	spec.Process.Capabilities.Permitted = []string{}
	labels := map[string]string{local.LabelInstance: r.instance}
	start := time.Now()
	c, err := r.client.NewContainer(ctx, id,
		containerd.WithImage(r.image),
		containerd.WithSnapshotter(local.Snapshotter),
		containerd.WithNewSnapshot(id, r.image, snapshots.WithLabels(labels)),
		containerd.WithRuntime("io.containerd.runc.v2", nil),
		containerd.WithSpec(spec),
		containerd.WithContainerLabels(labels),
	)
	if err != nil {
		return Sample{}, err
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup) }()
	var out, errOut bytes.Buffer
	task, err := c.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, &errOut), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		return Sample{}, err
	}
	defer func() {
		if _, err := task.Delete(context.WithoutCancel(ctx)); err != nil && !errdefs.IsNotFound(err) {
			_ = task.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
			_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		}
	}()
	exitCh, err := task.Wait(ctx)
	if err != nil {
		return Sample{}, err
	}
	if err := task.Start(ctx); err != nil {
		return Sample{}, err
	}
	st := <-exitCh
	task.IO().Wait()
	lat := time.Since(start)
	code, _, _ := st.Result()
	return Sample{Latency: lat}, checkOutput(p, out.String(), int(code))
}

func (r *runcRunner) Ready(context.Context, int) error { return nil }
func (r *runcRunner) Close()                           {}

// mcpRunner calls the tools of a real `airlock serve --transport stdio`
// through mcp-go's client, as an MCP client sees them.
type mcpRunner struct {
	c        *client.Client
	dir      string
	instance string
	ready    func(ctx context.Context, instance string, n int) error
	kenv     *kubeEnv // the cluster, in the Kubernetes modes
	steps    *callSteps
}

func newMCPRunner(ctx context.Context, bin, stateDir string, poolSize, concurrency int, ready func(context.Context, string, int) error, kenv *kubeEnv) (*mcpRunner, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-mcp-")
	if err != nil {
		return nil, err
	}
	before := instances(stateDir)
	// Debug level for the server's "call steps" lines, read from its stderr.
	cfg := fmt.Sprintf("state_dir: %s\nlog: {level: debug, format: json}\npool: {size: %d}\nlimits: {concurrency: %d, queue: %d, per_client_concurrency: %d, per_client_runs_per_minute: 1000000}\naudit: {path: %s}\napproval: {mode: off}\n",
		strconv.Quote(stateDir), poolSize, concurrency, 2*concurrency, 2*concurrency, strconv.Quote(filepath.Join(dir, "audit.jsonl")))
	if kenv != nil {
		cfg += kenv.mcpConfig()
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	steps := newCallSteps()
	c, err := client.NewStdioMCPClientWithOptions(bin, []string{"PATH=" + os.Getenv("PATH")}, []string{"serve", "--transport", "stdio", "--config", cfgPath},
		transport.WithCommandStderrWriter(steps))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var init mcp.InitializeRequest
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	init.Params.ClientInfo = mcp.Implementation{Name: "airlock-bench", Version: "1"}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := c.Initialize(ictx, init); err != nil {
		c.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initialize airlock over stdio: %w", err)
	}
	r := &mcpRunner{c: c, dir: dir, ready: ready, kenv: kenv, steps: steps}
	if kenv != nil {
		// No instance lock or guardian on Kubernetes: the Lease and the
		// pods it owns are the server's.
		return r, nil
	}
	// The server is the instance that registered while it started and is
	// held by a serving process (not, say, a guardian sweeping after the
	// last mode's server).
	for id, pid := range instances(stateDir) {
		if _, seen := before[id]; !seen && slices.Contains(cmdline(pid), "serve") {
			r.instance = id
		}
	}
	if r.instance == "" {
		c.Close()
		os.RemoveAll(dir)
		return nil, errors.New("the stdio server registered no instance")
	}
	return r, nil
}

// instances maps the ids of the instance lock files under stateDir to the
// pid each holds.
func instances(stateDir string) map[string]int {
	out := map[string]int{}
	dir := filepath.Join(stateDir, "instances")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".lock"); ok {
			b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			out[id], _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	return out
}

// cmdline is the arguments of process pid (nil when it is gone).
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || pid <= 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// guardianRunning reports whether the guardian of instance id still runs.
func guardianRunning(id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		args := cmdline(pid)
		if i := slices.Index(args, "--instance"); i >= 0 && i+1 < len(args) && args[i+1] == id && slices.Contains(args, "guard") {
			return true
		}
	}
	return false
}

func (r *mcpRunner) Run(ctx context.Context, p Program) (Sample, error) {
	tool, key := "run_python", "code"
	if p.Lang == "shell" {
		tool, key = "run_shell", "command"
	}
	var req mcp.CallToolRequest
	req.Params.Name = tool
	req.Params.Arguments = map[string]any{key: p.Code}
	start := time.Now()
	res, err := r.c.CallTool(ctx, req)
	lat := time.Since(start)
	if err != nil {
		return Sample{}, err
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return Sample{}, fmt.Errorf("%s: %s", p.Name, clip(b.String()))
	}
	sc, _ := res.StructuredContent.(map[string]any)
	stdout, _ := sc["stdout"].(string)
	runID, _ := sc["run_id"].(string)
	return Sample{Latency: lat, Warm: r.wasWarm(runID), Steps: r.steps.take(runID, time.Second)}, checkOutput(p, stdout, 0)
}

// wasWarm looks the run up in the server's audit log, which says whether
// it had a warm sandbox (read after the timing).
func (r *mcpRunner) wasWarm(runID string) bool {
	b, err := os.ReadFile(filepath.Join(r.dir, "audit.jsonl"))
	if err != nil {
		return false
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var rec struct {
			ID   string `json:"id"`
			Warm bool   `json:"warm"`
		}
		if json.Unmarshal([]byte(lines[i]), &rec) == nil && rec.ID == runID {
			return rec.Warm
		}
	}
	return false
}

func (r *mcpRunner) Ready(ctx context.Context, n int) error {
	if r.ready == nil {
		return nil
	}
	return r.ready(ctx, r.instance, n)
}

// Close ends the server and waits (a minute at most) for its guardian to
// have removed its sandboxes, so that the next mode is measured on a
// quiet host.
func (r *mcpRunner) Close() {
	r.c.Close()
	os.RemoveAll(r.dir)
	if r.kenv != nil {
		// Its pods go with its Lease when it leaves.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if n, err := r.kenv.count(context.Background(), ""); err != nil || n == 0 {
				return
			}
		}
		return
	}
	for deadline := time.Now().Add(time.Minute); guardianRunning(r.instance) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// sessionRunner measures a paused session's next call: each run pauses a
// session (untimed), then times the call that resumes it.
type sessionRunner struct {
	m        *local.ContainerdManager
	limits   runtime.Limits
	sessions chan runtime.Session
	all      []runtime.Session
}

func newSessionRunner(ctx context.Context, m *local.ContainerdManager, lim runtime.Limits, n int) (*sessionRunner, error) {
	r := &sessionRunner{m: m, limits: lim, sessions: make(chan runtime.Session, n)}
	for range n {
		sess, err := m.OpenSession(ctx, runtime.SessionOptions{ID: "s" + runtime.NewRunID(), Limits: lim, Owner: "bench", Idle: time.Hour, Lifetime: 2 * time.Hour})
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("open session: %w", err)
		}
		r.all = append(r.all, sess)
		r.sessions <- sess
	}
	return r, nil
}

func (r *sessionRunner) Run(ctx context.Context, p Program) (Sample, error) {
	sess := <-r.sessions
	defer func() { r.sessions <- sess }()
	if err := sess.(runtime.SessionPauser).Pause(ctx); err != nil {
		return Sample{}, fmt.Errorf("pause: %w", err)
	}
	start := time.Now()
	res, err := sess.Run(ctx, runtime.Request{Language: runtime.Language(p.Lang), Code: p.Code, Limits: r.limits, Trace: true})
	lat := time.Since(start)
	if err != nil {
		return Sample{}, err
	}
	if res.Resumed == 0 {
		return Sample{}, errors.New("the call did not resume its session")
	}
	steps := map[string]float64{"resume": runtime.Millis(res.Resumed)}
	for k, v := range res.Timings {
		steps[k] = v
	}
	return Sample{Latency: lat, Steps: steps}, checkOutput(p, res.Stdout, res.ExitCode)
}

func (r *sessionRunner) Ready(context.Context, int) error { return nil }

func (r *sessionRunner) Close() {
	for _, s := range r.all {
		s.Close()
	}
	_ = r.m.Close(context.Background())
}
