package runtime

import (
	"context"
	"errors"
	"sync"
	"syscall"
)

// KilledBy records in r that airlock killed the run's sandbox for reason
// (a tripwire, a monitor.kill_on attempt): the code's own doing, not an
// infrastructure fault or a timeout, and for a session, its end. It
// reports false and leaves r alone when err says the caller's context
// ended the run first (cancelled, past its deadline): that ending wins.
func (r *Result) KilledBy(reason string, session bool, err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	r.Reason, r.SessionLost, r.TimedOut = reason, session, false
	if r.ExitCode == 0 {
		r.ExitCode = 128 + int(syscall.SIGKILL)
	}
	return true
}

// Targets maps the ids a callback arrives by (run and session ids, as the
// egress proxy names its registrations) to what they run in (a sandbox, a
// pod), for as long as each is armed. The zero value is ready to use.
type Targets[T comparable] struct {
	mu sync.Mutex
	by map[string]T
}

// Arm maps id to target until forget is called; a later Arm of the same
// id replaces it, and then the earlier forget does nothing.
func (ts *Targets[T]) Arm(id string, target T) (forget func()) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.by == nil {
		ts.by = map[string]T{}
	}
	ts.by[id] = target
	return func() {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if ts.by[id] == target {
			delete(ts.by, id)
		}
	}
}

// Get is id's target, if one is armed.
func (ts *Targets[T]) Get(id string) (T, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.by[id]
	return t, ok
}
