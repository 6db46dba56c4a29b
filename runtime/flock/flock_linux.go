// Package flock takes exclusive file locks that a context can give up
// waiting for. The kernel drops a flock when its holder dies, so a crashed
// process never leaves a lock held.
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pollInterval is how often a held lock is retried: flock itself cannot be
// interrupted by a context.
const pollInterval = 20 * time.Millisecond

// Lock takes an exclusive flock on path (creating it), waiting while ctx
// allows. The returned func releases it.
func Lock(ctx context.Context, path string) (func(), error) {
	for {
		unlock, err := TryLock(path)
		if !errors.Is(err, ErrHeld) {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// ErrHeld is TryLock's answer when another holder has the lock.
var ErrHeld = errors.New("lock held")

// TryLock takes the lock on path only if it is free now; ErrHeld says
// another process (or another holder here) has it.
func TryLock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, ErrHeld)
	default:
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
}
