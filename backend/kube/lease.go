package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// An instance's Lease says it is alive, and owns its pods: deleting the
// Lease lets the cluster's garbage collector delete them, so an airlock
// that was SIGKILLed loses its pods as soon as any other airlock on the
// namespace sees its Lease expired, with no name patterns involved. A
// Lease is renewed every third of its duration, and taken for dead once
// unrenewed for twice its duration: the second duration is slack for
// clock skew and a slow renewal.
const defaultLeaseDuration = 30 * time.Second

// annAddress on an instance's Lease is where the other replicas reach its
// MCP endpoint (Options.Address).
const annAddress = "airlock.dev/address"

type instanceLease struct {
	client    kubernetes.Interface
	namespace string
	name      string
	uid       types.UID
	instance  string
	duration  time.Duration
	// afterRenew runs after each renewal: the sweep of what dead
	// instances and abandoned sessions left.
	afterRenew func(context.Context)
	log        *slog.Logger
	cancel     context.CancelFunc
	done       chan struct{}
}

// startLease creates this instance's Lease and keeps it renewed, calling
// afterRenew after each renewal.
func startLease(ctx context.Context, client kubernetes.Interface, namespace, instance, address string, duration time.Duration, afterRenew func(context.Context), log *slog.Logger) (*instanceLease, error) {
	now := metav1.NewMicroTime(time.Now())
	secs := int32(duration / time.Second)
	holder := instance
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "airlock-" + instance,
			Namespace: namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedBy, LabelInstance: instance},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
	}
	if address != "" {
		l.Annotations = map[string]string{annAddress: address}
	}
	created, err := client.CoordinationV1().Leases(namespace).Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the instance lease in namespace %s: %w", namespace, err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	il := &instanceLease{client: client, namespace: namespace, name: created.Name, uid: created.UID, instance: instance,
		duration: duration, afterRenew: afterRenew, log: log, cancel: cancel, done: make(chan struct{})}
	go il.renew(rctx)
	return il, nil
}

// owner is the owner reference every pod of this instance carries.
func (l *instanceLease) owner() metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: l.name, UID: l.uid}
}

func (l *instanceLease) renew(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.duration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := l.client.CoordinationV1().Leases(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
		if err == nil {
			now := metav1.NewMicroTime(time.Now())
			cur.Spec.RenewTime = &now
			_, err = l.client.CoordinationV1().Leases(l.namespace).Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			l.log.Warn("renew the instance lease", "lease", l.name, "err", err)
		}
		if l.afterRenew != nil {
			l.afterRenew(ctx)
		}
	}
}

// stop ends the renewals, deletes this instance's pods and then its Lease.
func (l *instanceLease) stop(ctx context.Context) error {
	l.cancel()
	<-l.done
	grace := int64(0)
	sel := fmt.Sprintf("%s=%s,%s=%s", LabelManagedBy, ManagedBy, LabelInstance, l.instance)
	perr := l.client.CoreV1().Pods(l.namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{LabelSelector: sel})
	if perr != nil {
		perr = fmt.Errorf("delete this instance's pods: %w", perr)
	}
	bg := metav1.DeletePropagationBackground
	err := l.client.CoordinationV1().Leases(l.namespace).Delete(ctx, l.name, metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the instance lease: %w", err)
	}
	return perr
}

// SweepExpired deletes the Leases of airlock instances that stopped
// renewing them; the garbage collector then deletes their pods. It
// returns how many it deleted. Leases of live instances, and objects
// airlock did not label, are never touched.
func SweepExpired(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) (int, error) {
	leases, err := instanceLeases(ctx, client, namespace)
	if err != nil {
		return 0, err
	}
	n := 0
	bg := metav1.DeletePropagationBackground
	for _, l := range leases {
		if !leaseExpired(l, now) {
			continue
		}
		// The precondition makes sure it is the Lease we judged, not a
		// new one by the same name.
		err := client.CoordinationV1().Leases(namespace).Delete(ctx, l.Name, metav1.DeleteOptions{
			PropagationPolicy: &bg,
			Preconditions:     &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion},
		})
		if err == nil {
			n++
		} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, fmt.Errorf("delete expired lease %s: %w", l.Name, err)
		}
	}
	return n, nil
}

// leaseExpired reports whether a Lease was last renewed longer ago than
// twice its duration.
func leaseExpired(l coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		// Not one airlock wrote; judge it by its age.
		return now.Sub(l.CreationTimestamp.Time) > 2*defaultLeaseDuration
	}
	d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	return now.Sub(l.Spec.RenewTime.Time) > 2*d
}

// Peers returns the MCP addresses of the namespace's other live airlock
// instances that published one: where a client's reply this replica
// cannot place may belong (server.HTTPOptions.Peers).
func (m *Manager) Peers(ctx context.Context) ([]string, error) {
	others, err := m.otherLeases(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []string
	for _, l := range others {
		addr := l.Annotations[annAddress]
		if addr == "" || leaseExpired(l, now) {
			continue
		}
		out = append(out, addr)
	}
	return out, nil
}

// instanceLeases lists the Leases of the namespace's airlock instances.
func instanceLeases(ctx context.Context, client kubernetes.Interface, namespace string) ([]coordinationv1.Lease, error) {
	list, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy + "," + LabelInstance})
	if err != nil {
		return nil, fmt.Errorf("list instance leases: %w", err)
	}
	return list.Items, nil
}

// otherLeases lists the Leases of the namespace's other airlock
// instances, leaving out those being deleted.
func (m *Manager) otherLeases(ctx context.Context) ([]coordinationv1.Lease, error) {
	leases, err := instanceLeases(ctx, m.o.Client, m.o.Namespace)
	if err != nil {
		return nil, err
	}
	others := leases[:0]
	for _, l := range leases {
		if l.Labels[LabelInstance] != m.o.InstanceID && l.DeletionTimestamp == nil {
			others = append(others, l)
		}
	}
	return others, nil
}
