package kube

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Claimer takes ready warm pods of one shape for one airlock instance.
// It knows the ready pods from a watch (an informer's cache), so a claim
// costs one update, not a list of the whole pool: the update carries the
// resourceVersion the cache holds, so of two instances claiming one pod
// the API server lets exactly one succeed, and a stale cache costs only a
// conflict. A claimed pod leaves the "ready" selector in the same write
// and is never handed out again.
type Claimer struct {
	pods       corev1client.PodInterface
	instance   string
	owner      metav1.OwnerReference
	maxTimeout time.Duration
	log        *slog.Logger
	informer   cache.SharedIndexInformer
	stop       chan struct{}
	stopOnce   sync.Once

	mu sync.Mutex
	// mine are pods this claimer is claiming or took and whose leaving the
	// cache the watch has not yet told: its cache still says ready, so its
	// other claims skip them.
	mine map[string]bool
	// conflicts counts claims the API server refused as stale.
	conflicts atomic.Int64
}

// ClaimerOptions configure a Claimer.
type ClaimerOptions struct {
	Client    kubernetes.Interface
	Namespace string
	// Shape is the LabelShape value of the pods it may take.
	Shape string
	// Instance and Owner are what a claimed pod is labelled with and owned by.
	Instance string
	Owner    metav1.OwnerReference
	// MaxTimeout tightens a claimed pod's deadline to one run.
	MaxTimeout time.Duration
	Log        *slog.Logger
}

// readySelector selects the ready warm pods of shape.
func readySelector(shape string) string {
	return fmt.Sprintf("%s=%s,%s=ready,%s=%s", LabelManagedBy, ManagedBy, LabelPool, LabelShape, shape)
}

// NewClaimer starts watching the ready pods of o.Shape; Stop ends it.
func NewClaimer(o ClaimerOptions) *Claimer {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(l *metav1.ListOptions) { l.LabelSelector = readySelector(o.Shape) }))
	c := &Claimer{pods: o.Client.CoreV1().Pods(o.Namespace), instance: o.Instance, owner: o.Owner,
		maxTimeout: o.MaxTimeout, log: o.Log, informer: f.Core().V1().Pods().Informer(),
		stop: make(chan struct{}), mine: map[string]bool{}}
	// The cache holds only what a claim reads; managed fields are most of
	// a pod's bytes.
	_ = c.informer.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			c.mu.Lock()
			delete(c.mine, m.GetName())
			c.mu.Unlock()
		}
	}})
	go c.informer.Run(c.stop)
	return c
}

// WaitSynced waits until the cache holds what the API server had when it
// started watching.
func (c *Claimer) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("watch ready warm pods: %w", context.Cause(ctx))
	}
	return nil
}

// Ready is how many ready pods the cache holds, those this claimer took
// and the watch has not yet reported gone included.
func (c *Claimer) Ready() int { return len(c.informer.GetStore().ListKeys()) }

// Conflicts is how many claims the API server refused because the pod
// had changed since it was read (another instance's claim, mostly).
func (c *Claimer) Conflicts() int64 { return c.conflicts.Load() }

// Stop ends the watch.
func (c *Claimer) Stop() { c.stopOnce.Do(func() { close(c.stop) }) }

// Claim takes a ready pod for runID and returns it as claimed; nil when
// the cache has none yet, none is ready, or every one went to another
// instance first.
func (c *Claimer) Claim(ctx context.Context, runID string) *corev1.Pod {
	if !c.informer.HasSynced() {
		return nil
	}
	items := c.informer.GetStore().List()
	// From a random place: instances claiming at once rarely collide.
	start := 0
	if len(items) > 0 {
		start = rand.IntN(len(items))
	}
	for i := range items {
		po, ok := items[(start+i)%len(items)].(*corev1.Pod)
		if !ok {
			continue
		}
		// The list is a snapshot; while this claim waited on others, the
		// watch may have reported the pod taken: read the cache again.
		if cur, ok, _ := c.informer.GetStore().Get(po); !ok {
			continue
		} else if po, ok = cur.(*corev1.Pod); !ok || !c.reserve(po.Name) {
			continue
		}
		if ctx.Err() != nil {
			c.release(po.Name)
			return nil
		}
		// The cache's objects are shared: change a copy.
		if got := c.claim(ctx, po.DeepCopy(), runID); got != nil {
			return got
		}
		c.release(po.Name)
	}
	return nil
}

// reserve marks name as this claimer's before it tries it, so two of its
// own claims at once never try the same pod; false when it already is.
func (c *Claimer) reserve(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mine[name] {
		return false
	}
	c.mine[name] = true
	return true
}

// release gives up a reservation whose claim failed. A pod another
// instance took leaves the cache soon; one still ready may be tried again.
func (c *Claimer) release(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mine, name)
}

// claim takes po: labels, owner and a tighter deadline in one update at
// the resourceVersion it was read at. A conflict from the kubelet's own
// status writes is retried while the pod is still ready; one from another
// instance's claim ends it.
func (c *Claimer) claim(ctx context.Context, po *corev1.Pod, runID string) *corev1.Pod {
	for attempt := 0; attempt < 3; attempt++ {
		if po.Labels[LabelPool] != "ready" || po.DeletionTimestamp != nil {
			return nil
		}
		po.Labels[LabelPool] = "taken"
		po.Labels[LabelRun] = runID
		po.Labels[LabelInstance] = c.instance
		po.OwnerReferences = []metav1.OwnerReference{c.owner}
		if po.Status.StartTime != nil {
			// Tighten the backstop to a run (it may only go down).
			d := int64(time.Since(po.Status.StartTime.Time)/time.Second) + int64((c.maxTimeout+time.Minute)/time.Second)
			if po.Spec.ActiveDeadlineSeconds == nil || d < *po.Spec.ActiveDeadlineSeconds {
				po.Spec.ActiveDeadlineSeconds = &d
			}
		}
		got, err := c.pods.Update(ctx, po, metav1.UpdateOptions{})
		if err == nil {
			return got
		}
		if apierrors.IsConflict(err) {
			c.conflicts.Add(1)
		} else {
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				c.log.Warn("claim warm pod", "pod", po.Name, "err", err)
			}
			return nil
		}
		if po, err = c.pods.Get(ctx, po.Name, metav1.GetOptions{}); err != nil {
			return nil
		}
	}
	return nil
}
