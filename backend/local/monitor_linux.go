package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/monitor"
)

// watcher receives gVisor's runtime monitoring events for this manager's
// sandboxes: every sandbox it creates is started with a trace session
// whose remote sink is the watcher's socket (via the runsc wrapper and a
// per-container config file), and the events are routed by container id.
type watcher struct {
	m      *ContainerdManager
	dir    string // MonitorDir/<instance>: configs of sandboxes being created
	config []byte // the trace session config, pointing at the socket
	ln     *monitor.Listener
	killOn map[string]bool

	mu   sync.Mutex
	live map[string]*sandbox // by container id
}

// newWatcher listens on a socket of its own under the instance's monitor
// dir (two managers of one instance each have theirs).
func newWatcher(m *ContainerdManager) (*watcher, error) {
	w := &watcher{m: m, dir: filepath.Join(MonitorDir(m.o.StateDir), m.o.InstanceID), killOn: map[string]bool{}, live: map[string]*sandbox{}}
	for _, k := range m.o.KillOn {
		w.killOn[k] = true
	}
	for _, k := range monitor.Kinds() {
		metrics.Escapes.Declare(string(k))
	}
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return nil, fmt.Errorf("runtime monitoring: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	sock := filepath.Join(w.dir, "m-"+hex.EncodeToString(b[:])+".sock")
	cfg, err := monitor.Config(sock)
	if err != nil {
		return nil, fmt.Errorf("runtime monitoring: %w", err)
	}
	w.config = cfg
	ln, err := monitor.Listen(sock, monitor.Options{
		OnEvent:   w.event,
		OnDropped: w.dropped,
		OnMalformed: func(id string, err error) {
			m.o.Log.Warn("runtime monitoring: a malformed message from a sandbox, skipped", "sandbox", id, "err", err)
		},
		OnConnClosed: func(id string, err error) {
			if err != nil {
				m.o.Log.Warn("runtime monitoring: a sandbox's connection failed; its attempts are no longer seen", "sandbox", id, "err", err)
			}
		},
		Log: m.o.Log.With("component", "monitor"),
	})
	if err != nil {
		return nil, fmt.Errorf("runtime monitoring: %w", err)
	}
	w.ln = ln
	return w, nil
}

// prepare readies monitoring of sandbox s before its task is created: its
// events go to s from now on, and the wrapper finds its config. The
// returned func removes the config once the create is over (runsc has read
// it by then); s.onDestroy stops the routing.
func (w *watcher) prepare(s *sandbox) (func(), error) {
	s.attempts = &runtime.Attempts{}
	w.mu.Lock()
	w.live[s.id] = s
	w.mu.Unlock()
	s.onDestroy(func(context.Context) {
		w.mu.Lock()
		delete(w.live, s.id)
		w.mu.Unlock()
	})
	p := filepath.Join(w.dir, s.id+".json")
	if err := os.WriteFile(p, w.config, 0o600); err != nil {
		return nil, fmt.Errorf("runtime monitoring config: %w", err)
	}
	return func() { _ = os.Remove(p) }, nil
}

// event counts one attempt against its sandbox, and ends the run at once
// when its kind is in monitor.kill_on. It runs on the listener's reader,
// so the kill goes on without it.
func (w *watcher) event(e monitor.Event) {
	w.mu.Lock()
	s := w.live[e.ContainerID]
	w.mu.Unlock()
	if s == nil {
		return
	}
	kind := string(e.Kind)
	s.attempts.Add(kind, e.Syscall)
	metrics.Escapes.Inc(kind)
	s.log().Warn("sandbox attempt", "kind", kind, "syscall", e.Syscall, "detail", e.Detail)
	if w.killOn[kind] && s.violated.CompareAndSwap(false, true) {
		go s.killNow()
	}
}

// dropped says that a sandbox's events were lost (its socket was full).
func (w *watcher) dropped(containerID string, n uint64) {
	metrics.MonitorDropped.Add(float64(n))
	w.m.o.Log.Warn("runtime monitoring events dropped", "sandbox", containerID, "dropped", n)
}

// take returns the attempts of s since the last take, once the listener
// has read everything s's sentry sent so far.
func (w *watcher) take(s *sandbox) []runtime.Attempt {
	if s.attempts == nil {
		return nil
	}
	if !w.ln.Sync(s.id, time.Second) {
		// The result goes out with what arrived; later events still count
		// in the metric and the log, and in the session's next result.
		s.log().Warn("runtime monitoring: the sandbox's events were not all read within 1s; this result may list fewer attempts")
	}
	return s.attempts.Take()
}

// noteAttempts puts into res what runtime monitoring saw during the run,
// and names a monitor.kill_on kill as such: the sandbox airlock killed is
// the run's result, not an infrastructure fault (and a session's is over).
func (m *ContainerdManager) noteAttempts(s *sandbox, res *runtime.Result, err error, session bool) error {
	if m.watch == nil {
		return err
	}
	res.Attempts = m.watch.take(s)
	if s.violated.Load() && res.KilledBy(runtime.ReasonPolicyViolation, session, err) {
		return nil
	}
	return err
}

// close stops the listener (it removes its socket) and the instance's
// monitor dir once no other manager of the instance uses it.
func (w *watcher) close() error {
	err := w.ln.Close()
	_ = os.Remove(w.dir) // fails while not empty, as it should
	return err
}

// killNow ends the sandbox at once (monitor.kill_on).
func (s *sandbox) killNow() {
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), s.m.o.Namespace), cleanupTimeout)
	defer cancel()
	if s.task == nil {
		return
	}
	if err := s.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		s.log().Warn("kill sandbox on a policy violation", "err", err)
	}
}
