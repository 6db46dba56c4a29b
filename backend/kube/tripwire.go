package kube

import (
	"context"

	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// tripwire is the proxy's callback: a planted fake credential left id's
// pod, which is deleted at once (grace 0), as a kill_on attempt is.
func (m *Manager) tripwire(id string, d egress.Denial) {
	p, ok := m.trips.Get(id)
	if !ok || !p.tripped.CompareAndSwap(false, true) {
		return
	}
	p.log.Warn("exfiltration tripwire: deleting the sandbox pod", "run", id, "host", d.Host, "port", d.Port, "method", d.Method)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		defer cancel()
		p.delete(ctx)
	}()
}
