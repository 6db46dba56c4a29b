// Package instance records which airlock processes are alive. Each live
// process holds an exclusive flock on its own file under state_dir/instances;
// the kernel drops the lock when the process dies, however it dies, so a
// crashed instance is seen as dead without any heartbeat.
package instance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/runtime/flock"
)

// Instance is this process's registration. Close it last, after its
// sandboxes are gone.
type Instance struct {
	ID       string
	stateDir string
	path     string
	f        *os.File
}

func dir(stateDir string) string { return filepath.Join(stateDir, "instances") }

// lockPath serialises arriving and leaving instances, so "am I the last?"
// has one answer at a time.
func lockPath(stateDir string) string { return filepath.Join(stateDir, "instances.lock") }

// Register creates and locks a new instance file.
func Register(stateDir string) (*Instance, error) {
	if err := os.MkdirAll(dir(stateDir), 0o700); err != nil {
		return nil, fmt.Errorf("create instances dir: %w", err)
	}
	unlock, err := flock.Lock(context.Background(), lockPath(stateDir))
	if err != nil {
		return nil, err
	}
	defer unlock()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("instance id: %w", err)
	}
	id := hex.EncodeToString(b)
	p := filepath.Join(dir(stateDir), id+".lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create instance file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		_ = os.Remove(p)
		return nil, fmt.Errorf("lock instance file: %w", err)
	}
	_, _ = fmt.Fprintf(f, "%d\n", os.Getpid())
	return &Instance{ID: id, stateDir: stateDir, path: p, f: f}, nil
}

// Leave unregisters the instance and, when no other instance is alive, runs
// last (stopping what the instances shared). Both happen under the lock
// Register takes: of instances leaving at once exactly the last runs it,
// and none can arrive in between to find its daemon stopped under it.
func (i *Instance) Leave(ctx context.Context, last func(context.Context)) error {
	if i == nil || i.f == nil {
		return nil
	}
	unlock, err := flock.Lock(ctx, lockPath(i.stateDir))
	if err != nil {
		return err
	}
	defer unlock()
	err = i.Close()
	if len(Others(i.stateDir, "")) == 0 && last != nil {
		last(ctx)
	}
	return err
}

// Close unregisters the instance.
func (i *Instance) Close() error {
	if i == nil || i.f == nil {
		return nil
	}
	err := os.Remove(i.path)
	if cerr := i.f.Close(); err == nil {
		err = cerr
	}
	i.f = nil
	return err
}

// Alive reports whether instance id is held by a running process. A dead
// instance's file is removed on the way.
func Alive(stateDir, id string) bool {
	if id == "" || strings.ContainsAny(id, "/.") {
		return false
	}
	return lockHeld(filepath.Join(dir(stateDir), id+".lock"), true)
}

// lockHeld reports whether a live process holds the flock on path. When
// it does not and remove is set, the file is removed while this call
// holds the lock, so no process can take it in between and be removed.
// A missing file is not held.
func lockHeld(path string, remove bool) bool {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	if remove {
		_ = os.Remove(path)
	}
	return false
}

// Others returns the ids of the live instances other than self.
func Others(stateDir, self string) []string {
	entries, err := os.ReadDir(dir(stateDir))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || id == self {
			continue
		}
		if Alive(stateDir, id) {
			out = append(out, id)
		}
	}
	return out
}
