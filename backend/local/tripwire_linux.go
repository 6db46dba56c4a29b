package local

import (
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// tripwire is the proxy's callback: a planted fake credential left id's
// sandbox, so the sandbox is killed at once, before anything else it
// sends.
func (m *ContainerdManager) tripwire(id string, d egress.Denial) {
	s, ok := m.trips.Get(id)
	if !ok || !s.tripped.CompareAndSwap(false, true) {
		return
	}
	s.log().Warn("exfiltration tripwire: killing the sandbox", "run", id, "host", d.Host, "port", d.Port, "method", d.Method)
	go s.killNow()
}

// noteTripwire names a tripwire kill as such in res: the code's own
// doing, not an infrastructure fault (and a session's end).
func noteTripwire(s *sandbox, res *runtime.Result, err error, session bool) error {
	if s.tripped.Load() && res.KilledBy(runtime.ReasonTripwire, session, err) {
		return nil
	}
	return err
}
