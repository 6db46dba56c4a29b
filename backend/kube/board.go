package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/approval"
)

// The approval board on the cluster: one ConfigMap per console request,
// in the sandbox namespace (where airlock's Role already is), owned by the
// posting instance's Lease so that a dead replica's requests go with it,
// as its waiting callers did. A decision is an update at the
// resourceVersion read, made only while the request is undecided and
// unexpired: of two approvers on two replicas, exactly one is recorded.
// A stateless client's retry claims its round-trip request the same way,
// so of two retries on two replicas exactly one runs.
const (
	// LabelApproval is the request's state: a console request is waiting,
	// then decided; a round-trip request is asked, then claimed by the
	// retry or expired.
	LabelApproval = "airlock.dev/approval"
	stateWaiting  = "waiting"
	stateDecided  = "decided"
	stateAsked    = "asked"
	stateClaimed  = "claimed"
	stateExpired  = "expired"
	annDecision   = "airlock.dev/decision" // approved | denied
	annApprover   = "airlock.dev/approver"
	annDecidedAt  = "airlock.dev/decided-at"
	annClaimedBy  = "airlock.dev/claimed-by"
	boardViewKey  = "view.json"
)

// Board implements approval.Board for the replicas on one namespace.
type Board struct {
	client    kubernetes.Interface
	namespace string
	instance  string
	owner     metav1.OwnerReference
	log       *slog.Logger
}

// Board returns the approval board of this instance's namespace.
func (m *Manager) Board() *Board {
	return &Board{client: m.o.Client, namespace: m.o.Namespace, instance: m.o.InstanceID, owner: m.lease.owner(), log: m.o.Log}
}

func boardName(id string) string { return "airlock-approval-" + id }

// Post implements approval.Board.
func (b *Board) Post(ctx context.Context, v approval.PendingView) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode approval request: %w", err)
	}
	state := stateWaiting
	if v.RoundTrip {
		state = stateAsked
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: boardName(v.ID), Namespace: b.namespace,
			Labels:          map[string]string{LabelManagedBy: ManagedBy, LabelInstance: b.instance, LabelApproval: state},
			OwnerReferences: []metav1.OwnerReference{b.owner},
		},
		Data: map[string]string{boardViewKey: string(data)},
	}
	if _, err := b.client.CoreV1().ConfigMaps(b.namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("post approval request: %w", err)
	}
	return nil
}

// Remove implements approval.Board.
func (b *Board) Remove(ctx context.Context, id string) error {
	err := b.client.CoreV1().ConfigMaps(b.namespace).Delete(ctx, boardName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove approval request: %w", err)
	}
	return nil
}

// Waiting implements approval.Board.
func (b *Board) Waiting(ctx context.Context) ([]approval.PendingView, error) {
	list, err := b.client.CoreV1().ConfigMaps(b.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("%s=%s,%s=%s", LabelManagedBy, ManagedBy, LabelApproval, stateWaiting)})
	if err != nil {
		return nil, fmt.Errorf("list approval requests: %w", err)
	}
	var out []approval.PendingView
	for _, cm := range list.Items {
		var v approval.PendingView
		if err := json.Unmarshal([]byte(cm.Data[boardViewKey]), &v); err != nil || boardName(v.ID) != cm.Name {
			b.log.Warn("skipping an approval request that does not parse", "configmap", cm.Name, "err", err)
			continue
		}
		out = append(out, v)
	}
	return out, nil
}

// errUnchanged tells change that the request is to stay as it is.
var errUnchanged = errors.New("unchanged")

// change reads request id, lets f decide on it and edit it, and writes it
// back at the resourceVersion read, so that of two replicas acting on one
// request exactly one wins; the other reads it again and sees what the
// first did. f returns errUnchanged to leave it be, or an approval error.
func (b *Board) change(ctx context.Context, id string, f func(cm *corev1.ConfigMap, v approval.PendingView) error) error {
	cms := b.client.CoreV1().ConfigMaps(b.namespace)
	for attempt := 0; attempt < 5; attempt++ {
		cm, err := cms.Get(ctx, boardName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && cm.Labels[LabelManagedBy] != ManagedBy) {
			return fmt.Errorf("approval %q: %w", id, approval.ErrUnknown)
		}
		if err != nil {
			return fmt.Errorf("read approval request: %w", err)
		}
		var v approval.PendingView
		if err := json.Unmarshal([]byte(cm.Data[boardViewKey]), &v); err != nil || v.ID != id {
			return fmt.Errorf("approval %q: %w", id, approval.ErrUnknown)
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		if err := f(cm, v); err != nil {
			return err
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("approval %q: %w", id, approval.ErrUnknown)
		case !apierrors.IsConflict(err):
			return fmt.Errorf("update approval request: %w", err)
		}
	}
	return fmt.Errorf("approval %s: it kept changing; retry", approval.Ref(id))
}

// Decide implements approval.Board.
func (b *Board) Decide(ctx context.Context, id string, approve bool, approver string, at time.Time) error {
	return b.change(ctx, id, func(cm *corev1.ConfigMap, v approval.PendingView) error {
		if cm.Labels[LabelApproval] == stateDecided {
			return fmt.Errorf("deciding %s (decided by %q at %s): %w", id, cm.Annotations[annApprover], cm.Annotations[annDecidedAt], approval.ErrAlreadyDecided)
		}
		if cm.Labels[LabelApproval] != stateWaiting {
			return fmt.Errorf("deciding %q: %w", id, approval.ErrUnknown)
		}
		if !at.Before(v.Expires) {
			return fmt.Errorf("deciding %s (expired at %s): %w", id, v.Expires.Format(time.RFC3339), approval.ErrExpired)
		}
		decision := "denied"
		if approve {
			decision = "approved"
		}
		cm.Labels[LabelApproval] = stateDecided
		cm.Annotations[annDecision], cm.Annotations[annApprover] = decision, approver
		cm.Annotations[annDecidedAt] = at.UTC().Format(time.RFC3339Nano)
		return nil
	})
}

// Claim implements approval.Board. A digest other than the one asked
// claims the request too, so that it can never be used.
func (b *Board) Claim(ctx context.Context, id, client, digest string, at time.Time) (approval.PendingView, error) {
	var got approval.PendingView
	var refused error
	err := b.change(ctx, id, func(cm *corev1.ConfigMap, v approval.PendingView) error {
		if !v.RoundTrip || v.Client != client {
			return fmt.Errorf("approval %q: %w", id, approval.ErrUnknown)
		}
		switch cm.Labels[LabelApproval] {
		case stateAsked:
		case stateClaimed:
			return fmt.Errorf("approval %s: %w", id, approval.ErrConsumed)
		case stateExpired:
			return fmt.Errorf("approval %s: %w", id, approval.ErrExpired)
		default:
			return fmt.Errorf("approval %q: %w", id, approval.ErrUnknown)
		}
		if !at.Before(v.Expires) {
			return fmt.Errorf("approval %s: %w", id, approval.ErrExpired)
		}
		refused = nil
		if v.Digest != digest {
			refused = fmt.Errorf("approval %s: %w", id, approval.ErrChanged)
		}
		cm.Labels[LabelApproval] = stateClaimed
		cm.Annotations[annClaimedBy] = b.instance
		got = v
		return nil
	})
	if err != nil {
		return approval.PendingView{}, err
	}
	return got, refused
}

// Abandon implements approval.Board.
func (b *Board) Abandon(ctx context.Context, id string) (bool, error) {
	abandoned := true
	err := b.change(ctx, id, func(cm *corev1.ConfigMap, _ approval.PendingView) error {
		if cm.Labels[LabelApproval] == stateClaimed {
			abandoned = false
			return errUnchanged
		}
		cm.Labels[LabelApproval] = stateExpired
		return nil
	})
	switch {
	case errors.Is(err, approval.ErrUnknown):
		return true, nil
	case err != nil && !errors.Is(err, errUnchanged):
		return false, err
	}
	return abandoned, b.Remove(ctx, id)
}

// Decisions implements approval.Board: it watches this instance's decided
// requests, listing again whenever the watch ends. An answer may be
// delivered twice; the ledger takes the first.
func (b *Board) Decisions(ctx context.Context, f func(id string, approve bool, approver string, at time.Time)) {
	cms := b.client.CoreV1().ConfigMaps(b.namespace)
	sel := fmt.Sprintf("%s=%s,%s=%s,%s=%s", LabelManagedBy, ManagedBy, LabelInstance, b.instance, LabelApproval, stateDecided)
	deliver := func(cm *corev1.ConfigMap) {
		var v approval.PendingView
		if json.Unmarshal([]byte(cm.Data[boardViewKey]), &v) != nil || boardName(v.ID) != cm.Name {
			return
		}
		at, err := time.Parse(time.RFC3339Nano, cm.Annotations[annDecidedAt])
		if err != nil {
			return
		}
		f(v.ID, cm.Annotations[annDecision] == "approved", cm.Annotations[annApprover], at)
	}
	// backOff says why and waits a second, so a failing API is not asked
	// in a tight loop.
	backOff := func(what string, err error) {
		b.log.Warn(what, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	for ctx.Err() == nil {
		list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			backOff("list approval decisions", err)
			continue
		}
		for i := range list.Items {
			deliver(&list.Items[i])
		}
		w, err := cms.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			backOff("watch approval decisions", err)
			continue
		}
		for ev := range w.ResultChan() {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				deliver(cm)
			}
		}
		w.Stop()
	}
}

var _ approval.Board = (*Board)(nil)
