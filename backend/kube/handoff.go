package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// At shutdown an airlock hands its sessions to the namespace's other
// airlocks rather than ending them, so that a rolling update (a replica
// replaced by a new one) keeps every session's state: the session pod
// loses its holder label, keeps its idle deadline, and the client's next
// call, on whichever airlock gets it, adopts it. An instance that is
// leaving says so on its Lease first; sessions go only to an instance that
// is live and not leaving, and the last one to leave ends the sessions no
// one holds. Two instances leaving at once (a scale to zero) cannot both
// hand on: each marks itself before it looks, so the later of the two
// sees the other leaving; and each looks again after it handed on.
const annLeaving = "airlock.dev/leaving"

// markLeaving records on this instance's Lease that it is shutting down,
// once.
func (m *Manager) markLeaving(ctx context.Context) error {
	m.leaving.Do(func() {
		leases := m.o.Client.CoordinationV1().Leases(m.o.Namespace)
		m.leavingErr = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := leases.Get(ctx, m.lease.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			l.Annotations[annLeaving] = "true"
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			return err
		})
		if m.leavingErr != nil {
			m.leavingErr = fmt.Errorf("mark the instance lease as leaving: %w", m.leavingErr)
		}
	})
	return m.leavingErr
}

// othersServe marks this instance leaving and reports whether another
// airlock on the namespace is live and staying, so can adopt a session.
func (m *Manager) othersServe(ctx context.Context) (bool, error) {
	if err := m.markLeaving(ctx); err != nil {
		return false, err
	}
	others, err := m.otherLeases(ctx)
	if err != nil {
		return false, err
	}
	now := time.Now()
	for _, l := range others {
		if l.Annotations[annLeaving] != "" {
			continue
		}
		// Renewed within its duration: a stricter test than the sweep's.
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
			now.Sub(l.Spec.RenewTime.Time) <= time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
			return true, nil
		}
	}
	return false, nil
}

// handOnTarget is othersServe asked once per shutdown, for every session
// released at it; endUnheld asks again afterwards.
func (m *Manager) handOnTarget(ctx context.Context) (bool, error) {
	m.handOn.Do(func() { m.handOnOK, m.handOnErr = m.othersServe(ctx) })
	return m.handOnOK, m.handOnErr
}

// Release implements runtime.SessionReleaser: at shutdown, the session
// goes to the namespace's other airlocks when one is live and staying,
// and ends (as Close) otherwise. It waits for a call in progress.
func (ss *session) Release() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	others, err := ss.m.handOnTarget(ctx)
	if err != nil {
		ss.p.log.Warn("cannot tell whether another airlock can take the session; ending it", "err", err)
	}
	if !others {
		ss.closeLocked()
		return
	}
	if err := ss.update(ctx, func(po *corev1.Pod) {
		delete(po.Labels, LabelInstance)
		delete(po.Annotations, annBusyUntil)
	}); err != nil {
		ss.p.log.Warn("hand the session on; ending it", "err", err)
		ss.closeLocked()
		return
	}
	ss.closed = true
	ss.p.letGo()
	ss.p.detach()
	ss.p.log.Info("session handed on to the other airlocks", "idle_until", ss.obj.Annotations[annIdleUntil])
}

// endUnheld runs as this instance stops, after its sessions were handed on
// or ended: when no airlock that stays is left, it deletes the session
// pods no instance holds (this one's, handed on while another was still
// staying, and any an instance leaving beside it handed on), since nobody
// is left to adopt them. A session an instance holds is its own to end.
func (m *Manager) endUnheld(ctx context.Context) error {
	others, err := m.othersServe(ctx)
	if err != nil || others {
		return err
	}
	sel := fmt.Sprintf("%s=%s,%s,!%s", LabelManagedBy, ManagedBy, LabelSession, LabelInstance)
	if _, err := deleteSessionPods(ctx, m.o.Client, m.o.Namespace, sel, func(*corev1.Pod) bool { return true }); err != nil {
		return fmt.Errorf("end the sessions no airlock holds: %w", err)
	}
	return nil
}
