//go:build unix

package approval

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// checkKeyOwner refuses a key file another user owns: they could swap it.
func checkKeyOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("audit key %s is owned by uid %d, not by airlock's uid %d: run chown %d %s", path, st.Uid, uid, uid, path)
	}
	return nil
}

// lockAuditFile takes an exclusive lock on path (made if missing): the
// airlocks that share a log (instances share a state_dir) take turns, so
// each line links to the one really before it.
func lockAuditFile(path string) (func(), error) {
	// Read-only when it exists: a lock needs no write access, and a log
	// on a file system gone read-only must fail at its own write, which
	// says so.
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	}
	if err != nil {
		return nil, fmt.Errorf("audit lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}
