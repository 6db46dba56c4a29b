// Package daemon starts and supervises the embedded containerd that airlock
// uses when no containerd.address is configured.
//
// One daemon serves every airlock process that shares a state_dir (Claude
// Desktop starts one airlock per window): the first to arrive starts it, and
// the last live instance to leave (instance.Leave) stops it.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/airlock-mcp/airlock/runtime/flock"
)

// Options configure the embedded daemon.
type Options struct {
	StateDir string
	Binary   string // containerd executable
	Log      *slog.Logger
}

// Daemon is this process's claim on the shared embedded containerd.
type Daemon struct {
	opts Options
	dir  string
	// Address is the daemon's gRPC socket.
	Address string
	// seen is the daemon process this handle last knew: Supervise tells
	// a restart by another instance from a pid that changed.
	seen int
}

// Paths of the embedded daemon under state_dir.
func paths(stateDir string) (dir, sock string) {
	dir = filepath.Join(stateDir, "containerd")
	return dir, filepath.Join(dir, "containerd.sock")
}

// Acquire returns a running embedded containerd, starting it when none runs.
func Acquire(ctx context.Context, o Options) (*Daemon, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	dir, sock := paths(o.StateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create containerd dir: %w", err)
	}
	d := &Daemon{opts: o, dir: dir, Address: sock}
	unlock, err := flock.Lock(ctx, filepath.Join(dir, "daemon.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	if pid := d.pid(); pid > 0 && ping(ctx, sock) == nil {
		o.Log.Debug("using running embedded containerd", "pid", pid, "address", sock)
		d.seen = pid
		return d, nil
	}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	d.seen = d.pid()
	return d, nil
}

func (d *Daemon) start(ctx context.Context) error {
	bin, err := exec.LookPath(d.opts.Binary)
	if err != nil {
		return fmt.Errorf("find containerd binary %q (run `airlock doctor`): %w", d.opts.Binary, err)
	}
	// A daemon that died uncleanly leaves its socket behind.
	_ = os.Remove(d.Address)
	cfgPath := filepath.Join(d.dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(Config(d.dir, d.Address)), 0o600); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(d.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open containerd log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the daemon outlives this airlock if others still use it,
	// and a signal to our process group (Ctrl-C) must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	pid := cmd.Process.Pid
	// Reap it if it exits while we live; otherwise init adopts it.
	go func() { _ = cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(d.dir, "containerd.pid"), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("write containerd pid: %w", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if err := ping(ctx, d.Address); err == nil {
			d.opts.Log.Info("started embedded containerd", "pid", pid, "address", d.Address)
			return nil
		}
		if time.Now().After(deadline) || !ProcessAlive(pid) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("embedded containerd did not come up (see %s)", filepath.Join(d.dir, "containerd.log"))
		}
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Supervise watches the daemon until ctx ends and restarts it when it has
// died or stopped answering: down is called when it is found gone, up after
// it answers again. Instances sharing the daemon restart it once, under the
// daemon lock; failed restarts back off from 1 s to 30 s.
func (d *Daemon) Supervise(ctx context.Context, down, up func()) {
	const every = time.Second
	backoff, silent := time.Second, 0
	wait := every
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = every
		if ping(ctx, d.Address) == nil {
			backoff, silent = time.Second, 0
			// Another instance sharing the daemon may have restarted it
			// between two pings: this one's sandboxes lost their exit
			// waits all the same, and must hear of it.
			if pid := d.pid(); pid > 0 && pid != d.seen {
				d.opts.Log.Warn("embedded containerd was restarted by another instance", "pid", pid, "was", d.seen)
				d.seen = pid
				down()
				up()
			}
			continue
		}
		// A live daemon that is slow to answer is given three tries
		// before it is replaced; a dead one is replaced at once.
		if silent++; d.pid() > 0 && silent < 3 {
			continue
		}
		d.opts.Log.Error("embedded containerd is down; restarting it", "silent_pings", silent)
		down()
		if err := d.restart(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d.opts.Log.Error("restart embedded containerd", "err", err, "retry_in", backoff)
			wait, backoff = backoff, min(2*backoff, 30*time.Second)
			continue
		}
		backoff, silent = time.Second, 0
		d.seen = d.pid()
		up()
	}
}

// restart starts the daemon again unless another instance already has.
func (d *Daemon) restart(ctx context.Context) error {
	unlock, err := flock.Lock(ctx, filepath.Join(d.dir, "daemon.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if d.pid() > 0 && ping(ctx, d.Address) == nil {
		return nil
	}
	if pid := d.pid(); pid > 0 {
		// Alive but not answering: it goes.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && ProcessAlive(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return d.start(ctx)
}

// PID is the running daemon's process id, 0 when none runs.
func (d *Daemon) PID() int { return d.pid() }

// Stop stops the daemon. Callers run it when the last instance leaves
// (instance.Leave); it holds the daemon lock so no Acquire races it.
func (d *Daemon) Stop(ctx context.Context) error {
	unlock, err := flock.Lock(ctx, filepath.Join(d.dir, "daemon.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	return d.stop()
}

func (d *Daemon) stop() error {
	pid := d.pid()
	if pid <= 0 {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 100 && ProcessAlive(pid); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if ProcessAlive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = os.Remove(filepath.Join(d.dir, "containerd.pid"))
	d.opts.Log.Info("stopped embedded containerd", "pid", pid)
	return nil
}

// pid returns the recorded daemon pid if that process is a live containerd.
func (d *Daemon) pid() int {
	b, err := os.ReadFile(filepath.Join(d.dir, "containerd.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || !ProcessAlive(pid) {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "containerd") {
		return 0
	}
	return pid
}

// ProcessAlive reports whether pid is a running process: one that exists
// and is not a zombie.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	// A zombie is not alive; /proc/PID/stat's third field is the state.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func ping(ctx context.Context, addr string) error {
	if _, err := os.Stat(addr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := containerd.New(addr, containerd.WithTimeout(time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Version(ctx)
	return err
}

// Config renders the embedded daemon's config.toml. Only what airlock needs is
// enabled: the CRI plugin (Kubernetes) is off, and the socket, root and state
// are private to state_dir so a host containerd is never touched.
func Config(dir, sock string) string {
	return fmt.Sprintf(`# Written by airlock; changes are overwritten at the next start.
version = 3
root = %q
state = %q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.cri.v1.images",
  "io.containerd.cri.v1.runtime",
  "io.containerd.podsandbox.controller.v1.podsandbox",
  "io.containerd.sandbox.controller.v1.shim",
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "warn"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
}
