package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/exchange"
)

// session is one sandbox kept for many calls (see Session). One call at a
// time. A paused session has no sandbox: its checkpoint is on disk (see
// pause_linux.go) and its next call restores it.
type session struct {
	m     *ContainerdManager
	s     *sandbox // nil while paused
	id    string
	files map[string][]byte // proxy settings of a networked session
	o     runtime.SessionOptions
	// created, used and calls are what a checkpoint's manifest records.
	created, used time.Time
	calls         int

	mu     sync.Mutex // one call at a time
	closed bool
	// why says why a session ended while paused (a damaged or evicted
	// checkpoint); its next call is told.
	why string
	// While paused: the checkpoint's directory and manifest, and the lock
	// that says this process serves it.
	dir    string
	mf     *manifest
	unlock func()
	// lost is read without mu: the reaper asks while a call holds it.
	lost atomic.Bool
}

// OpenSession starts a session, from a warm sandbox when one fits.
func (m *ContainerdManager) OpenSession(ctx context.Context, o runtime.SessionOptions) (_ runtime.Session, err error) {
	networked := o.Egress != nil
	if networked && (m.o.Network == nil || m.o.Proxy == nil) {
		return nil, errors.New("runtime: this server offers no network (network.allow_domains is empty)")
	}
	if err := runtime.CheckOverlay(o.Env, o.HomeFiles); err != nil {
		return nil, err
	}
	s, _, err := m.acquire(ctx, o.ID, networked, o.Limits)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ss := &session{m: m, s: s, id: o.ID, o: o, created: now, used: now}
	defer func() {
		if err != nil {
			ss.Close()
		}
	}()
	if networked {
		forget := m.trips.Arm(o.ID, s)
		unregister := m.o.Proxy.Register(s.att.IP, o.ID, *o.Egress)
		s.onDestroy(func(context.Context) { unregister(); forget() })
		ss.files = runtime.ProxyFiles(m.proxyURL(), m.o.CABundle)
	}
	if err := s.st.Send(driver.FrameSession, nil); err != nil {
		return nil, runtime.Infra("start session", err)
	}
	return ss, nil
}

// ID is the session's id.
func (ss *session) ID() string { return ss.id }

// Run runs one call in the session. It takes a sandbox slot for the call,
// like any run. A call that times out is interrupted and the session kept
// if the interpreter stops in time; Result.SessionLost says when it did
// not, or when the code killed the interpreter, and the session is then
// closed.
func (ss *session) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if !ss.mu.TryLock() {
		return runtime.Result{RunID: req.RunID}, runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if ss.closed {
		return runtime.Result{RunID: req.RunID}, ss.closedErr()
	}
	if req.RunID == "" {
		req.RunID = runtime.NewRunID()
	}
	release, err := ss.m.admission.Acquire(ctx)
	if err != nil {
		return runtime.Result{RunID: req.RunID}, err
	}
	defer release()
	start := time.Now()
	resumed, err := ss.resumeLocked(ctx)
	if err != nil {
		return runtime.Result{RunID: req.RunID}, err
	}
	ss.calls++
	ss.used = time.Now()
	// The session's own every call, as its files: the sandbox's
	// environment was fixed before the session was known.
	req = runtime.OverlayRequest(req, ss.o.Env, ss.o.HomeFiles)
	res, err := ss.s.run(ctx, req, ss.files, true)
	res.Resumed = resumed
	err = ss.m.noteAttempts(ss.s, &res, err, true)
	err = noteTripwire(ss.s, &res, err, true)
	if ss.s.att != nil {
		res.EgressDenied = ss.m.o.Proxy.TakeDenials(ss.id)
	}
	ss.m.o.Log.Info("session run finished", "session", ss.id, "run", req.RunID, "lang", req.Language, "exit", res.ExitCode,
		"reason", res.Reason, "lost", res.SessionLost, "took", res.Duration, "total", time.Since(start))
	if res.SessionLost {
		ss.lost.Store(true)
		ss.closeLocked()
	}
	return res, err
}

// File does one file operation in the session's /workspace, as the code's
// user, inside the sandbox.
func (ss *session) File(ctx context.Context, op driver.FileOp) (driver.FileResult, error) {
	if !ss.mu.TryLock() {
		return driver.FileResult{}, runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if ss.closed {
		return driver.FileResult{}, ss.closedErr()
	}
	if ss.s == nil {
		release, err := ss.m.admission.Acquire(ctx)
		if err != nil {
			return driver.FileResult{}, err
		}
		_, err = ss.resumeLocked(ctx)
		release()
		if err != nil {
			return driver.FileResult{}, err
		}
	}
	ss.used = time.Now()
	res, err := ss.s.st.FileOp(ctx, op)
	if errors.Is(err, exchange.ErrStreamEnded) {
		ss.lost.Store(true)
		ss.closeLocked()
	}
	return res, err
}

// Lost reports whether the session ended because its sandbox or its
// interpreter did.
func (ss *session) Lost() bool { return ss.lost.Load() }

// Close destroys the session's sandbox; it waits for a call in progress.
func (ss *session) Close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closeLocked()
}

func (ss *session) closeLocked() {
	if ss.closed {
		return
	}
	ss.closed = true
	if ss.s != nil {
		ss.m.teardowns.Start(ss.s.destroy, nil)
		return
	}
	ss.dropCheckpoint()
}

// closedErr is the error of a call to a session that has ended.
func (ss *session) closedErr() error {
	if ss.why != "" {
		return fmt.Errorf("%w: %s", runtime.ErrSessionClosed, ss.why)
	}
	return runtime.ErrSessionClosed
}

// Release, at shutdown, keeps a paused session's checkpoint for the next
// airlock on this state_dir (see AdoptSession); a running session is
// closed.
func (ss *session) Release() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.s == nil && !ss.closed {
		ss.closed = true
		ss.m.forgetPaused(ss)
		if ss.unlock != nil {
			ss.unlock()
			ss.unlock = nil
		}
		return
	}
	ss.closeLocked()
}

// checkpointDir is where the session's checkpoint lives while paused.
func (ss *session) checkpointDir() string {
	return filepath.Join(CheckpointsDir(ss.m.o.StateDir, ss.m.o.DeploymentID), ss.id)
}

// dropCheckpoint deletes a paused session's checkpoint and lets go of it.
func (ss *session) dropCheckpoint() {
	ss.m.forgetPaused(ss)
	if ss.dir != "" {
		if err := os.RemoveAll(ss.dir); err != nil {
			ss.m.o.Log.Warn("remove session checkpoint", "session", ss.id, "err", err)
		}
		ss.dir, ss.mf = "", nil
	}
	if ss.unlock != nil {
		_ = os.Remove(ss.checkpointDir() + ".lock")
		ss.unlock()
		ss.unlock = nil
	}
}
