package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/flock"
)

// Paused sessions: Pause checkpoints an idle session's sandbox into
// CheckpointsDir/<id> and destroys it, so an idle session holds disk, not
// memory; its next call restores it (resumeLocked). While paused, the
// process serving the session holds CheckpointsDir/<id>.lock: another
// airlock on the same state_dir adopts the session (AdoptSession) only
// when nobody does, so a paused session survives a restart.

// ErrPauseNetworked is returned by Pause for a networked session, which
// is not paused: its network attachment does not survive a checkpoint.
var ErrPauseNetworked = errors.New("a networked session is not paused: only sessions with network none are")

// PausesSessions reports whether sessions pause and fork: with the runc
// shim, which lets airlock run runsc checkpoint and restore.
func (m *ContainerdManager) PausesSessions() bool { return m.o.Shim == ShimRunc }

// Pause checkpoints the session to disk and destroys its sandbox. A paused
// session stays paused; a busy one is refused with ErrSessionBusy.
func (ss *session) Pause(ctx context.Context) error {
	if !ss.mu.TryLock() {
		return runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if ss.closed {
		return ss.closedErr()
	}
	if ss.s == nil {
		return nil
	}
	if ss.files != nil {
		return ErrPauseNetworked
	}
	return ss.pauseLocked(ctx)
}

// Paused reports whether the session is on disk now.
func (ss *session) Paused() bool {
	if !ss.mu.TryLock() {
		return false // a call holds it, so it is running
	}
	defer ss.mu.Unlock()
	return ss.s == nil && !ss.closed
}

func (ss *session) pauseLocked(ctx context.Context) error {
	m := ss.m
	dir := ss.checkpointDir()
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("create checkpoints dir: %w", err)
	}
	unlock, err := flock.Lock(ctx, dir+".lock")
	if err != nil {
		return fmt.Errorf("lock session checkpoint: %w", err)
	}
	runsc, err := m.runscDigest()
	if err != nil {
		unlock()
		return fmt.Errorf("hash runsc: %w", err)
	}
	tmp := dir + ".new"
	_ = os.RemoveAll(tmp)
	start := time.Now()
	if err := m.checkpoint(ctx, ss.s, filepath.Join(tmp, imageDirName), false); err != nil {
		_ = os.RemoveAll(tmp)
		unlock()
		select {
		case <-ss.s.exited:
			// The checkpoint took the sandbox with it: the session is over.
			ss.lost.Store(true)
			ss.closeLocked()
		default:
		}
		return runtime.Infra("checkpoint session", err)
	}
	// The checkpoint ended the sandbox. Its teardown finishes before the
	// session counts as paused, so a restore can take its container id.
	s := ss.s
	ss.s = nil
	s.destroy()
	mf := m.newManifest(s, runsc)
	mf.Session, mf.Owner, mf.Created, mf.LastUsed, mf.PausedAt = ss.id, ss.o.Owner, ss.created, ss.used, time.Now()
	mf.Idle, mf.Lifetime, mf.Calls, mf.Limits = int64(ss.o.Idle), int64(ss.o.Lifetime), ss.calls, ss.o.Limits
	err = writeManifest(tmp, mf)
	if err == nil {
		_ = os.RemoveAll(dir)
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		unlock()
		ss.lost.Store(true)
		ss.closed = true
		return runtime.Infra("write session checkpoint", err)
	}
	ss.dir, ss.mf, ss.unlock = dir, mf, unlock
	m.o.Log.Info("session paused", "session", ss.id, "bytes", mf.bytes(), "took", time.Since(start))
	if m.notePaused(ss) {
		return ss.closedErr()
	}
	return nil
}

// resumeLocked restores a paused session's sandbox, and says how long that
// took (0 when it was running). A checkpoint that cannot be restored ends
// the session with the reason, so no call runs on state other than its own.
func (ss *session) resumeLocked(ctx context.Context) (time.Duration, error) {
	if ss.s != nil {
		return 0, nil
	}
	m := ss.m
	start := time.Now()
	if _, err := os.Stat(ss.dir); err != nil {
		ss.endPaused("its checkpoint is gone from disk")
		return 0, ss.closedErr()
	}
	if err := m.verify(ss.dir, ss.mf); err != nil {
		m.o.Log.Error("session checkpoint refused", "session", ss.id, "err", err)
		ss.endPaused("it was paused to disk and cannot be resumed: " + err.Error())
		return 0, ss.closedErr()
	}
	verified := time.Since(start)
	s, err := m.restore(ctx, ss.id, ss.dir, ss.mf, ss.o.Limits)
	if err != nil {
		var co *runtime.CircuitOpenError
		if errors.As(err, &co) || ctx.Err() != nil {
			return 0, err // the checkpoint is kept for the next call
		}
		m.o.Log.Error("session restore failed", "session", ss.id, "err", err)
		ss.endPaused("it was paused to disk and its restore failed: " + err.Error())
		return 0, ss.closedErr()
	}
	ss.s = s
	ss.dropCheckpoint()
	took := time.Since(start)
	m.o.Log.Info("session resumed", "session", ss.id, "took", took, "verify", verified)
	return took, nil
}

// endPaused ends a paused session, deleting its checkpoint; why is what
// its next call is told.
func (ss *session) endPaused(why string) {
	ss.why = why
	ss.closed = true
	ss.lost.Store(true)
	ss.dropCheckpoint()
}

// notePaused counts a paused session against the checkpoint budget, and
// ends the oldest paused sessions while checkpoints exceed it. The caller
// holds ss.mu; it reports whether ss itself had to end.
func (m *ContainerdManager) notePaused(ss *session) bool {
	m.pausedMu.Lock()
	m.paused[ss.id] = ss
	list := make([]*session, 0, len(m.paused))
	for _, o := range m.paused {
		if o != ss {
			list = append(list, o)
		}
	}
	m.pausedMu.Unlock()
	if m.o.CheckpointBytes <= 0 {
		return false
	}
	// The others, oldest pause first; one busy (being resumed) is passed
	// over, and never waited for.
	type entry struct {
		ss *session
		at time.Time
	}
	var others []entry
	for _, o := range list {
		if o.mu.TryLock() {
			if o.mf != nil && !o.closed {
				others = append(others, entry{o, o.mf.PausedAt})
			} else {
				o.mu.Unlock()
			}
		}
	}
	defer func() {
		for _, e := range others {
			e.ss.mu.Unlock()
		}
	}()
	sort.Slice(others, func(i, j int) bool { return others[i].at.Before(others[j].at) })
	total := ss.mf.bytes()
	for _, e := range others {
		total += e.ss.mf.bytes()
	}
	why := fmt.Sprintf("it was paused to disk and its checkpoint was removed to keep paused sessions within sessions.checkpoint_mb (%d MiB)", m.o.CheckpointBytes>>20)
	for _, e := range others {
		if total <= m.o.CheckpointBytes {
			return false
		}
		total -= e.ss.mf.bytes()
		m.o.Log.Info("paused session ended for the checkpoint budget", "session", e.ss.id)
		e.ss.endPaused(why)
	}
	if total > m.o.CheckpointBytes {
		m.o.Log.Info("paused session ended for the checkpoint budget", "session", ss.id)
		ss.endPaused(why)
		return true
	}
	return false
}

func (m *ContainerdManager) forgetPaused(ss *session) {
	m.pausedMu.Lock()
	delete(m.paused, ss.id)
	m.pausedMu.Unlock()
}

// sessionID is the shape of a session id; anything else is never a path.
var sessionID = regexp.MustCompile(`^s[0-9a-f]{16}$`)

// AdoptSession takes over a paused session whose checkpoint another
// airlock on this state_dir left (it was restarted): when it belongs to
// owner and no running airlock serves it. Its next call restores it.
func (m *ContainerdManager) AdoptSession(ctx context.Context, id, owner string) (runtime.Session, runtime.SessionRecord, error) {
	if !sessionID.MatchString(id) || m.o.Shim != ShimRunc {
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	dir := filepath.Join(CheckpointsDir(m.o.StateDir, m.o.DeploymentID), id)
	mf, err := readManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	if err == nil && mf.Owner != owner {
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	// One try: a lock held means another airlock serves it.
	unlock, lerr := flock.TryLock(dir + ".lock")
	if lerr != nil {
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	if err != nil {
		// A manifest that does not parse: its owner is unknown, so the
		// checkpoint is removed and nobody resumes it.
		_ = os.RemoveAll(dir)
		_ = os.Remove(dir + ".lock")
		unlock()
		m.o.Log.Error("session checkpoint removed", "session", id, "err", err)
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	o := runtime.SessionOptions{ID: id, Owner: mf.Owner, Idle: time.Duration(mf.Idle), Lifetime: time.Duration(mf.Lifetime), Limits: mf.Limits}
	ss := &session{m: m, id: id, o: o, created: mf.Created, used: mf.LastUsed, calls: mf.Calls, dir: dir, mf: mf, unlock: unlock}
	ss.mu.Lock()
	evicted := m.notePaused(ss)
	ss.mu.Unlock()
	if evicted {
		return nil, runtime.SessionRecord{}, runtime.ErrNoSession
	}
	m.o.Log.Info("paused session adopted", "session", id, "paused_at", mf.PausedAt)
	return ss, runtime.SessionRecord{Owner: mf.Owner, Created: mf.Created, LastUsed: mf.LastUsed, Idle: o.Idle, Calls: mf.Calls}, nil
}

// checkpointSweepEvery is how often checkpoints nobody serves are looked
// at (sweepCheckpoints).
const checkpointSweepEvery = time.Minute

// sweepCheckpointsEvery sweeps at once and then every d until ctx ends.
func (m *ContainerdManager) sweepCheckpointsEvery(ctx context.Context, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		m.sweepCheckpoints()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LeftSessions lists owner's paused sessions that no airlock serves: a
// restarted airlock's, which AdoptSession takes over.
func (m *ContainerdManager) LeftSessions(owner string) []string {
	if m.o.Shim != ShimRunc {
		return nil
	}
	base := CheckpointsDir(m.o.StateDir, m.o.DeploymentID)
	entries, _ := os.ReadDir(base)
	var ids []string
	for _, e := range entries {
		if !e.IsDir() || !sessionID.MatchString(e.Name()) {
			continue
		}
		m.pausedMu.Lock()
		_, mine := m.paused[e.Name()]
		m.pausedMu.Unlock()
		if mine {
			continue
		}
		if mf, err := readManifest(filepath.Join(base, e.Name())); err == nil && mf.Owner == owner {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// sweepCheckpoints removes what a restart left in the checkpoints dir
// that nobody will resume: half-written checkpoints, and paused sessions
// past their idle timeout or lifetime that no airlock serves.
func (m *ContainerdManager) sweepCheckpoints() {
	base := CheckpointsDir(m.o.StateDir, m.o.DeploymentID)
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	now := time.Now()
	for _, e := range entries {
		name := e.Name()
		id := strings.TrimSuffix(strings.TrimSuffix(name, ".new"), ".lock")
		if !sessionID.MatchString(id) {
			continue
		}
		dir := filepath.Join(base, id)
		unlock, err := flock.TryLock(dir + ".lock")
		if err != nil {
			continue // served by a running airlock
		}
		mf, merr := readManifest(dir)
		expired := merr != nil ||
			now.Sub(mf.LastUsed) > time.Duration(mf.Idle) || now.Sub(mf.Created) > time.Duration(mf.Lifetime)
		_ = os.RemoveAll(dir + ".new")
		if expired {
			_ = os.RemoveAll(dir)
			_ = os.Remove(dir + ".lock")
			m.o.Log.Info("removed an ended session's checkpoint", "session", id)
		}
		unlock()
	}
}

// reseed is the cell a forked session runs first: the fork was restored
// from its parent's memory, so Python's random generators would repeat the
// parent's numbers. os.urandom (and uuid4, secrets) draw from the
// sandbox's own kernel and differ already.
const reseed = `[getattr(__import__("sys").modules.get(n), "seed", lambda: None)() for n in ("random", "numpy.random")]`

// Fork makes a new session, o.ID, from this one: the same variables and
// /workspace, independent from then on. A running session is checkpointed
// without stopping; a paused one is restored twice from its checkpoint.
func (ss *session) Fork(ctx context.Context, o runtime.SessionOptions) (_ runtime.Session, err error) {
	if !ss.mu.TryLock() {
		return nil, runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if ss.closed {
		return nil, ss.closedErr()
	}
	if ss.files != nil {
		return nil, errors.New("a networked session cannot be forked: only sessions with network none can")
	}
	if err := runtime.CheckOverlay(o.Env, o.HomeFiles); err != nil {
		return nil, err
	}
	m := ss.m
	release, err := m.admission.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	dir, mf := ss.dir, ss.mf
	if ss.s != nil {
		runsc, err := m.runscDigest()
		if err != nil {
			return nil, fmt.Errorf("hash runsc: %w", err)
		}
		base := filepath.Join(CheckpointsDir(m.o.StateDir, m.o.DeploymentID), o.ID)
		dir = base + ".new"
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return nil, fmt.Errorf("create checkpoints dir: %w", err)
		}
		// Held while the fork's checkpoint exists, so no sweep takes it.
		unlock, err := flock.Lock(ctx, base+".lock")
		if err != nil {
			return nil, fmt.Errorf("lock fork checkpoint: %w", err)
		}
		defer func() {
			_ = os.RemoveAll(dir)
			_ = os.Remove(base + ".lock")
			unlock()
		}()
		if err := m.checkpoint(ctx, ss.s, filepath.Join(dir, imageDirName), true); err != nil {
			return nil, runtime.Infra("checkpoint session for fork", err)
		}
		mf = m.newManifest(ss.s, runsc)
		if mf.Files, err = hashImage(filepath.Join(dir, imageDirName)); err != nil {
			return nil, fmt.Errorf("hash fork checkpoint: %w", err)
		}
	} else if err := m.verify(dir, mf); err != nil {
		return nil, fmt.Errorf("the session's checkpoint cannot be forked: %w", err)
	}
	s, err := m.restore(ctx, o.ID, dir, mf, ss.o.Limits)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	o.Limits = ss.o.Limits
	fork := &session{m: m, s: s, id: o.ID, o: o, created: now, used: now}
	res, err := s.run(ctx, runtime.Request{RunID: "reseed-" + o.ID, Language: runtime.Python, Code: reseed, Limits: ss.o.Limits}, nil, true)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		fork.Close()
		return nil, runtime.Infra("reseed forked session", err)
	}
	m.o.Log.Info("session forked", "session", ss.id, "fork", o.ID)
	return fork, nil
}
