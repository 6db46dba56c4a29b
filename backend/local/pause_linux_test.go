package local_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/runtime"
)

// pauseSession pauses sess and checks that nothing of its sandbox is left
// running: no container, no runsc process naming it.
func pauseSession(t *testing.T, sess runtime.Session) string {
	t.Helper()
	s := need(t)
	p, ok := sess.(runtime.SessionPauser)
	if !ok {
		t.Fatal("the local backend's sessions do not pause")
	}
	if err := p.Pause(context.Background()); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if !p.Paused() {
		t.Fatal("Paused() is false after Pause")
	}
	id := "airlock-" + sess.ID()
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	if _, err := s.Client.LoadContainer(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("container %s still exists while paused (err %v)", id, err)
	}
	if pids := processesNaming(id); len(pids) > 0 {
		t.Errorf("processes of the paused sandbox still run: %v", pids)
	}
	dir := filepath.Join(local.CheckpointsDir(s.Config.StateDir, s.Deployment), sess.ID())
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err != nil {
		t.Fatalf("no manifest: %v", err)
	}
	return dir
}

// processesNaming lists the pids whose command line names id.
func processesNaming(id string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), id) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func TestPausedSessionResumesWithItsState(t *testing.T) {
	sess := openSession(t)
	cell(t, sess, runtime.Python, "import os, random\nx = 41\nos.makedirs('/workspace/d')\nos.chdir('/workspace/d')\nopen('f.txt', 'w').write('kept')", 0)
	cell(t, sess, runtime.Shell, "echo shell > /workspace/s.txt", 0)
	dir := pauseSession(t, sess)

	r := cell(t, sess, runtime.Python, "(x + 1, os.getcwd(), open('f.txt').read(), open('/workspace/s.txt').read().strip())", 0)
	if want := "(42, '/workspace/d', 'kept', 'shell')"; display(r) != want {
		t.Fatalf("after resume: display %q stderr %q; want %s", display(r), r.Stderr, want)
	}
	if r.Resumed <= 0 {
		t.Errorf("Result.Resumed = %v, want the restore's time", r.Resumed)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("checkpoint %s kept after the resume (err %v)", dir, err)
	}
	// Running again: no resume.
	if r := cell(t, sess, runtime.Python, "x", 0); display(r) != "41" || r.Resumed != 0 {
		t.Fatalf("second call: %q resumed %v", display(r), r.Resumed)
	}
	// Paused twice, resumed by a file operation.
	pauseSession(t, sess)
	if r := cell(t, sess, runtime.Shell, "cat /workspace/d/f.txt", 0); r.Stdout != "kept" {
		t.Fatalf("shell after the second resume: %+v", r)
	}
}

func TestDamagedCheckpointEndsTheSession(t *testing.T) {
	sess := openSession(t)
	cell(t, sess, runtime.Python, "x = 1", 0)
	dir := pauseSession(t, sess)
	ents, err := os.ReadDir(filepath.Join(dir, "image"))
	if err != nil || len(ents) == 0 {
		t.Fatalf("checkpoint image: %v %v", ents, err)
	}
	// One byte flipped in the largest file.
	var big string
	var size int64
	for _, e := range ents {
		fi, _ := e.Info()
		if fi.Size() > size {
			big, size = filepath.Join(dir, "image", e.Name()), fi.Size()
		}
	}
	f, err := os.OpenFile(big, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	_, _ = f.ReadAt(b, size/2)
	b[0] ^= 0xff
	_, _ = f.WriteAt(b, size/2)
	f.Close()

	_, err = sess.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "x", Limits: limits()})
	if !errors.Is(err, runtime.ErrSessionClosed) || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), filepath.Base(big)) {
		t.Fatalf("run on a damaged checkpoint: %v; want the session ended, naming the damaged file", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("damaged checkpoint kept (err %v)", err)
	}
	if !sess.Lost() {
		t.Error("session not reported lost")
	}
}

func TestPausedSessionIsAdoptedAfterRestart(t *testing.T) {
	s := need(t)
	var sm runtime.SessionManager = s.Manager
	id := "s" + runtime.NewRunID()
	sess, err := sm.OpenSession(context.Background(), runtime.SessionOptions{ID: id, Limits: limits(), Owner: "alice", Idle: 600e9, Lifetime: 3600e9})
	if err != nil {
		t.Fatal(err)
	}
	cell(t, sess, runtime.Python, "y = 'before'", 0)
	pauseSession(t, sess)
	// What shutdown does: the paused session is handed on, not ended.
	sess.(runtime.SessionReleaser).Release()

	if _, _, err := s.Manager.AdoptSession(context.Background(), id, "mallory"); !errors.Is(err, runtime.ErrNoSession) {
		t.Fatalf("another owner adopted it: %v", err)
	}
	got, rec, err := s.Manager.AdoptSession(context.Background(), id, "alice")
	if err != nil {
		t.Fatalf("AdoptSession: %v", err)
	}
	t.Cleanup(func() { got.Close(); assertNoSandboxes(t, s) })
	if rec.Owner != "alice" || rec.Calls != 1 {
		t.Errorf("record %+v", rec)
	}
	// Held now: a second adoption (another airlock) is refused.
	if _, _, err := s.Manager.AdoptSession(context.Background(), id, "alice"); !errors.Is(err, runtime.ErrNoSession) {
		t.Fatalf("adopted twice: %v", err)
	}
	if r := cell(t, got, runtime.Python, "y", 0); display(r) != "'before'" || r.Resumed <= 0 {
		t.Fatalf("after adoption: %q (stderr %q) resumed %v", display(r), r.Stderr, r.Resumed)
	}
}

func TestForkGivesTwoIndependentSessions(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "paused"}[paused], func(t *testing.T) {
			parent := openSession(t)
			cell(t, parent, runtime.Python, "import random, uuid\nx = [1]\nopen('/workspace/f', 'w').write('parent')", 0)
			if paused {
				pauseSession(t, parent)
			}
			fork, err := parent.(runtime.SessionForker).Fork(context.Background(), runtime.SessionOptions{ID: "sfork" + runtime.NewRunID(), Owner: "o"})
			if err != nil {
				t.Fatalf("Fork: %v", err)
			}
			t.Cleanup(fork.Close) // before the parent's, which checks for leaks
			if r := cell(t, fork, runtime.Python, "x.append(2)\nopen('/workspace/f', 'w').write('fork')\nx", 0); display(r) != "[1, 2]" {
				t.Fatalf("fork: %q (stderr %q)", display(r), r.Stderr)
			}
			if r := cell(t, parent, runtime.Python, "(x, open('/workspace/f').read())", 0); display(r) != "([1], 'parent')" {
				t.Fatalf("parent after the fork changed: %q (stderr %q)", display(r), r.Stderr)
			}
			// Restored from the same memory, yet their random numbers differ.
			for _, draw := range []string{"random.random()", "str(uuid.uuid4())"} {
				a, b := display(cell(t, parent, runtime.Python, draw, 0)), display(cell(t, fork, runtime.Python, draw, 0))
				if a == "" || a == b {
					t.Fatalf("parent and fork drew the same %s: %q %q", draw, a, b)
				}
			}
		})
	}
}

func TestCheckpointBudgetEndsTheOldestPausedSession(t *testing.T) {
	s := need(t)
	first, second := openSession(t), openSession(t)
	cell(t, first, runtime.Python, "a = 1", 0)
	cell(t, second, runtime.Python, "b = 2", 0)
	dir := pauseSession(t, first)
	size := int64(0)
	ents, _ := os.ReadDir(filepath.Join(dir, "image"))
	for _, e := range ents {
		fi, _ := e.Info()
		size += fi.Size()
	}
	// Room for one checkpoint and a half: the second pause ends the first.
	old := local.SetCheckpointBytes(s.Manager, size*3/2)
	t.Cleanup(func() { local.SetCheckpointBytes(s.Manager, old) })
	pauseSession(t, second)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the oldest checkpoint is still there (err %v)", err)
	}
	_, err := first.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "a", Limits: limits()})
	if !errors.Is(err, runtime.ErrSessionClosed) || !strings.Contains(err.Error(), "sessions.checkpoint_mb") {
		t.Fatalf("the evicted session's next call: %v; want it ended, naming sessions.checkpoint_mb", err)
	}
	if r := cell(t, second, runtime.Python, "b", 0); display(r) != "2" || r.Resumed <= 0 {
		t.Fatalf("the newer session: %q resumed %v", display(r), r.Resumed)
	}
}
