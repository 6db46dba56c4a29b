package kube

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
)

// Labels of warm pods.
const (
	// LabelPool is "warming" while a warm pod starts, "ready" once its
	// driver has preloaded, "taken" once a run claimed it.
	LabelPool = "airlock.dev/pool"
	// LabelShape is a hash of everything a warm pod was built from: only
	// an airlock that would build the same pod may take it.
	LabelShape = "airlock.dev/shape"
)

// pool keeps warm pods: PoolSize per airlock instance, each with its driver
// started and Python's modules imported. Any instance on the namespace
// whose pods have the same shape may take any ready one, through its
// Claimer; a taken pod is deleted after its run.
type pool struct {
	m       *Manager
	size    int
	limits  runtime.Limits
	shape   string
	maxIdle time.Duration
	claimer *Claimer
	wake    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
	// ctx ends a warm pod's start when the pool stops.
	ctx    context.Context
	cancel context.CancelFunc
}

// fillEvery is how often the filler looks without being woken (a take
// wakes it): each look is one LIST of this instance's warm pods.
const fillEvery = 5 * time.Second

// warmTimeout bounds the start of a warm pod: scheduling, and the preload.
const warmTimeout = 3 * time.Minute

func newPool(m *Manager) *pool {
	p := &pool{m: m, size: m.o.PoolSize, limits: m.o.PoolLimits, maxIdle: m.o.PoolMaxIdle,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.shape = shapeOf(m.o)
	p.claimer = NewClaimer(ClaimerOptions{Client: m.o.Client, Namespace: m.o.Namespace, Shape: p.shape,
		Instance: m.o.InstanceID, Owner: m.lease.owner(), MaxTimeout: m.o.MaxTimeout, Log: m.o.Log})
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.fill()
	return p
}

// shapeOf hashes what a warm pod is built from.
func shapeOf(o Options) string {
	env := make([]string, 0, len(o.Env))
	for k, v := range o.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	sel := make([]string, 0, len(o.NodeSelector))
	for k, v := range o.NodeSelector {
		sel = append(sel, k+"="+v)
	}
	sort.Strings(sel)
	l := o.PoolLimits
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%d|%d|%d|%g|%d|%d|%d|%s|%s|%s|%s|%+v",
		o.Image, o.RuntimeClass, o.UID, o.GID, l.MemoryBytes, l.CPUs, l.Pids, l.WorkspaceBytes, l.TmpBytes,
		strings.Join(o.PoolPreload, ","), strings.Join(env, "\x00"), strings.Join(sel, ","), o.SchedulerName, o.Tolerations)))
	return hex.EncodeToString(h[:8])
}

func (p *pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take claims a ready warm pod for runID and attaches to it; nil when
// none is ready (or every one was claimed first by another instance).
func (p *pool) take(ctx context.Context, runID string) *pod {
	defer p.kick()
	po := p.claimer.Claim(ctx, runID)
	if po == nil {
		return nil
	}
	o := p.m.o
	s := p.m.newPod(po.Name, o.Log.With("pod", po.Name, "run", runID))
	if err := s.attach(ctx); err != nil {
		o.Log.Warn("attach to warm pod; starting a cold one", "pod", po.Name, "err", err)
		p.m.teardowns.Start(s.destroy, nil)
		return nil
	}
	return s
}

// fill keeps this instance's warm pods at size, retiring those idle for
// longer than maxIdle, and backs off when creation fails.
func (p *pool) fill() {
	defer p.wg.Done()
	failures := 0
	for {
		select {
		case <-p.done:
			return
		case <-p.wake:
		case <-time.After(fillEvery):
		}
		have, err := p.retireStale()
		if err != nil {
			p.m.o.Log.Warn("list this instance's warm pods", "err", err)
			continue
		}
		for ; have < p.size; have++ {
			if p.stopping() || p.m.admission.InUse() >= p.m.admission.Slots() {
				break
			}
			if err := p.warmOne(); err != nil {
				if p.stopping() {
					return
				}
				failures++
				wait := min(time.Duration(1<<min(failures, 5))*time.Second, 30*time.Second)
				p.m.o.Log.Warn("warm pod failed; cold starts meanwhile", "err", err, "retry_in", wait)
				select {
				case <-p.done:
					return
				case <-time.After(wait):
				}
				break
			}
			failures = 0
		}
	}
}

func (p *pool) stopping() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// retireStale deletes this instance's ready pods older than maxIdle, and
// returns how many warm pods (ready or warming) it still has. A delete
// carries the resourceVersion it judged, so a pod claimed meanwhile stays.
func (p *pool) retireStale() (int, error) {
	o := p.m.o
	pods := o.Client.CoreV1().Pods(o.Namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: fmt.Sprintf("%s=%s,%s=%s,%s in (warming,ready)", LabelManagedBy, ManagedBy, LabelInstance, o.InstanceID, LabelPool)})
	if err != nil {
		return 0, err
	}
	have := 0
	grace := int64(0)
	for _, po := range list.Items {
		if po.DeletionTimestamp != nil {
			continue
		}
		if po.Labels[LabelPool] == "ready" && time.Since(po.CreationTimestamp.Time) > p.maxIdle {
			rv := po.ResourceVersion
			err := pods.Delete(ctx, po.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
			if err == nil || apierrors.IsNotFound(err) {
				continue
			}
			if !apierrors.IsConflict(err) {
				o.Log.Warn("retire warm pod", "pod", po.Name, "err", err)
			}
		}
		have++
	}
	return have, nil
}

// warmOne starts one warm pod and waits until its driver has preloaded,
// then marks it ready for any instance to take.
func (p *pool) warmOne() (err error) {
	o := p.m.o
	ctx, cancel := context.WithTimeout(p.ctx, warmTimeout)
	defer cancel()
	name := "airlock-w" + runtime.NewRunID()[1:]
	s := p.m.newPod(name, o.Log.With("pod", name))
	pol := p.m.policy(name, map[string]string{LabelPool: "warming", LabelShape: p.shape}, p.limits,
		p.maxIdle+warmTimeout+o.MaxTimeout+helloTimeout+time.Minute)
	pol.Preload, pol.PreloadModules = true, o.PoolPreload
	spec, err := Pod(pol)
	if err != nil {
		return err
	}
	pods := o.Client.CoreV1().Pods(o.Namespace)
	if _, err := pods.Create(ctx, spec, metav1.CreateOptions{}); err != nil {
		return createError(err, p.limits)
	}
	defer func() {
		if err != nil {
			p.m.teardowns.Start(s.destroy, nil)
		}
	}()
	if err := s.waitRunning(ctx, true, warmTimeout); err != nil {
		return err
	}
	metrics.SandboxStart.WithLabelValues("pool").Observe(time.Since(s.created).Seconds())
	// Ready for anyone: only now does the pod match a taker's selector.
	// The kubelet's status writes may move the version meanwhile: retried.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Labels[LabelPool] = "ready"
		_, err = pods.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// stop ends the filler. The warm pods go with the instance's Lease.
func (p *pool) stop() {
	close(p.done)
	p.cancel()
	p.wg.Wait()
	p.claimer.Stop()
}
