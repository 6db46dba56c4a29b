package local

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/airlock-mcp/airlock/runtime"
)

// OpRuntimeRestarted is the InfraError op of such a run.
const OpRuntimeRestarted = "sandbox runtime restarted"

// RuntimeDown tells the manager containerd was found gone: runs that fail
// from now until it is back are reported as ended by the restart.
func (m *ContainerdManager) RuntimeDown() { m.restarts.Add(1) }

// RuntimeRestarted tells the manager containerd answers again. Sandboxes
// whose teardown failed while it was down are removed now; the warm pool
// is emptied (its sandboxes' exit watches broke with the connection) and
// refilled; and an open breaker may probe at once.
func (m *ContainerdManager) RuntimeRestarted(ctx context.Context) {
	m.restarts.Add(1)
	// The client's connection reconnects with a backoff of its own: wait
	// until it answers before reconciling.
	for i := 0; i < 50; i++ {
		if _, err := m.o.Client.Version(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	m.o.Log.Info("sandbox runtime is back; reconciling")
	if m.pool != nil {
		m.pool.drain()
	}
	m.breaker.ProbeNow()
	// Again a little later: a teardown in progress across the restart
	// finishes (or fails) after the first pass.
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if n, err := m.reconcile(ctx); err != nil {
			m.o.Log.Warn("reconcile sandboxes after the runtime restarted", "err", err)
		} else if n > 0 {
			m.o.Log.Info("removed sandboxes left by the runtime restart", "count", n)
		}
	}
}

// reconcile removes this instance's containers that no live sandbox of
// this manager holds. A sandbox is tracked before its container exists,
// so one being made is never taken for a leftover.
func (m *ContainerdManager) reconcile(ctx context.Context) (int, error) {
	return removeContainers(ctx, m.o.Client, m.o.Namespace, m.o.DeploymentID, func(id, instance string) bool {
		return instance == m.o.InstanceID && !m.tracked(id)
	})
}

// track and untrack keep the set of sandboxes this manager holds.
func (m *ContainerdManager) track(s *sandbox) {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	m.live[s.id] = s
}

func (m *ContainerdManager) tracked(id string) bool {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	_, ok := m.live[id]
	return ok
}

func (m *ContainerdManager) untrack(s *sandbox) {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	delete(m.live, s.id)
}

// restartedDuring turns the error of a run that overlapped a runtime
// restart (gen is m.restarts when it began), or that failed because the
// connection to containerd broke, into one that says so.
func (m *ContainerdManager) restartedDuring(gen uint64, err error) error {
	var ie *runtime.InfraError
	if err == nil || !errors.As(err, &ie) {
		return err
	}
	if m.restarts.Load() == gen && !lostContainerd(err) {
		return err
	}
	return &runtime.InfraError{Op: OpRuntimeRestarted, Err: fmt.Errorf("%w: %w", runtime.ErrRuntimeRestarted, err)}
}

// lostContainerd reports whether err is containerd's connection going away
// (the daemon died), as opposed to containerd answering with an error.
func lostContainerd(err error) bool {
	return errdefs.IsUnavailable(err) || status.Code(err) == codes.Unavailable
}
