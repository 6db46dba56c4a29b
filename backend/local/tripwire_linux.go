package local

import (
	"context"
	"errors"
	"sync"
	"syscall"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// tripTargets maps the proxy registrations of live runs and sessions (by
// run or session id) to their sandboxes, so that a tripped request kills
// the sandbox that sent it.
type tripTargets struct {
	mu sync.Mutex
	by map[string]*sandbox
}

// watchTrips arms id's sandbox for the proxy's tripwire callback until
// the returned function is called.
func (m *ContainerdManager) watchTrips(id string, s *sandbox) (forget func()) {
	m.trips.mu.Lock()
	defer m.trips.mu.Unlock()
	if m.trips.by == nil {
		m.trips.by = map[string]*sandbox{}
	}
	m.trips.by[id] = s
	return func() {
		m.trips.mu.Lock()
		defer m.trips.mu.Unlock()
		if m.trips.by[id] == s {
			delete(m.trips.by, id)
		}
	}
}

// tripwire is the proxy's callback: a planted fake credential left id's
// sandbox, so the sandbox is killed at once, before anything else it
// sends.
func (m *ContainerdManager) tripwire(id string, d egress.Denial) {
	m.trips.mu.Lock()
	s := m.trips.by[id]
	m.trips.mu.Unlock()
	if s == nil || !s.tripped.CompareAndSwap(false, true) {
		return
	}
	s.log().Warn("exfiltration tripwire: killing the sandbox", "run", id, "host", d.Host, "port", d.Port, "method", d.Method)
	go s.killNow()
}

// noteTripwire names a tripwire kill as such in res: the code's own
// doing, not an infrastructure fault (and a session's end).
func noteTripwire(s *sandbox, res *runtime.Result, err error, session bool) error {
	if !s.tripped.Load() || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	res.Reason, res.SessionLost, res.TimedOut = runtime.ReasonTripwire, session, false
	if res.ExitCode == 0 {
		res.ExitCode = 128 + int(syscall.SIGKILL)
	}
	return nil
}
