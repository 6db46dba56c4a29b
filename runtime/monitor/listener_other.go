//go:build !linux

package monitor

import (
	"errors"
	"runtime"
	"time"
)

// Listener is the remote sink endpoint for runsc's trace sessions. gVisor runs
// only on Linux; elsewhere Listen always fails.
type Listener struct{}

// Listen fails: runtime monitoring needs Linux.
func Listen(path string, opts Options) (*Listener, error) {
	return nil, errors.New("runtime monitoring is not supported on " + runtime.GOOS)
}

// Path returns "".
func (l *Listener) Path() string { return "" }

// Close does nothing.
func (l *Listener) Close() error { return nil }

// Sync reports true: there is nothing to wait for.
func (l *Listener) Sync(containerID string, timeout time.Duration) bool { return true }
