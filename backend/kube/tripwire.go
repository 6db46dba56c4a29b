package kube

import (
	"context"
	"sync"

	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// tripTargets maps this replica's proxy registrations (run or session
// ids) to their pods, so that a tripped request deletes the pod that
// sent it.
type tripTargets struct {
	mu sync.Mutex
	by map[string]*pod
}

func (m *Manager) watchTrips(id string, p *pod) (forget func()) {
	m.trips.mu.Lock()
	defer m.trips.mu.Unlock()
	if m.trips.by == nil {
		m.trips.by = map[string]*pod{}
	}
	m.trips.by[id] = p
	return func() {
		m.trips.mu.Lock()
		defer m.trips.mu.Unlock()
		if m.trips.by[id] == p {
			delete(m.trips.by, id)
		}
	}
}

// tripwire is the proxy's callback: a planted fake credential left id's
// pod, which is deleted at once (grace 0), as a kill_on attempt is.
func (m *Manager) tripwire(id string, d egress.Denial) {
	m.trips.mu.Lock()
	p := m.trips.by[id]
	m.trips.mu.Unlock()
	if p == nil || !p.tripped.CompareAndSwap(false, true) {
		return
	}
	p.log.Warn("exfiltration tripwire: deleting the sandbox pod", "run", id, "host", d.Host, "port", d.Port, "method", d.Method)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		defer cancel()
		p.delete(ctx)
	}()
}
