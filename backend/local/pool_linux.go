package local

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/runtime"
)

// warmTimeout bounds how long a pooled sandbox may take to become ready
// (its Python worker importing numpy and pandas).
const warmTimeout = 2 * time.Minute

// CPU weights of pooled sandboxes: low while they warm and wait, so that
// filling the pool never takes CPU from live runs, normal once taken.
const (
	cpuSharesIdle   = 2
	cpuSharesNormal = 1024
)

// Pool keeps warm sandboxes ready: started, with the driver's Python worker
// holding numpy and pandas imported, waiting for code. A run takes one and
// the sandbox is destroyed after it, never reused; the pool refills in the
// background. One set is kept per network mode.
type Pool struct {
	m       *ContainerdManager
	size    int
	limits  runtime.Limits
	maxIdle time.Duration
	keys    []bool // network modes served: false (none), true (allowlist)

	mu      sync.Mutex
	ready   map[bool][]*pooled
	stopped bool

	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

type pooled struct {
	s       *sandbox
	readyAt time.Time
}

func newPool(m *ContainerdManager, size int, lim runtime.Limits, maxIdle time.Duration) *Pool {
	if maxIdle <= 0 {
		maxIdle = 10 * time.Minute
	}
	p := &Pool{m: m, size: size, limits: lim, maxIdle: maxIdle, keys: []bool{false},
		ready: map[bool][]*pooled{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if m.o.Network != nil && m.o.Proxy != nil {
		p.keys = append(p.keys, true)
	}
	p.wg.Add(1)
	go p.fill()
	return p
}

// fits reports whether a run with limits l can use a pooled sandbox: the
// limits built into the sandbox must be the same. The timeout and output
// caps are the host's business and may differ.
func (p *Pool) fits(l runtime.Limits) bool {
	return p.limits.SameSandbox(l)
}

// Ready is how many warm sandboxes wait, per network mode.
func (p *Pool) Ready() (none, allowlist int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[false]), len(p.ready[true])
}

// take hands out a warm sandbox for runID, or nil when none is ready.
func (p *Pool) take(ctx context.Context, networked bool, runID string) *sandbox {
	defer p.kick()
	for {
		p.mu.Lock()
		list := p.ready[networked]
		if len(list) == 0 {
			p.mu.Unlock()
			return nil
		}
		e := list[0]
		p.ready[networked] = list[1:]
		p.mu.Unlock()
		select {
		case <-e.s.st.Gone():
			p.retire(e.s) // died while waiting
			continue
		default:
		}
		p.setCPUShares(e.s.id, cpuSharesNormal)
		e.s.takenBy(runID)
		// The run is known by its own id, whatever the sandbox was made
		// as. The labels are for sweeps and operators, not for the run:
		// they are written beside it (a containerd write is a database
		// commit, about 1.7 ms), and the teardown waits for them.
		labelled := make(chan struct{})
		go func() {
			defer close(labelled)
			lctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.WithoutCancel(ctx), p.m.o.Namespace), cleanupTimeout)
			defer cancel()
			if _, err := e.s.container.SetLabels(lctx, map[string]string{LabelRun: runID, LabelPool: "taken"}); err != nil {
				p.m.o.Log.Warn("label pooled sandbox", "sandbox", e.s.id, "err", err)
			}
		}()
		e.s.onDestroy(func(context.Context) { <-labelled })
		return e.s
	}
}

// kick wakes the filler.
func (p *Pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Pool) retire(s *sandbox) {
	p.m.teardowns.Start(s.destroy, nil)
}

// drain destroys the sandboxes waiting; the filler makes new ones.
func (p *Pool) drain() {
	p.mu.Lock()
	for key, list := range p.ready {
		for _, e := range list {
			p.retire(e.s)
		}
		p.ready[key] = nil
	}
	p.mu.Unlock()
	p.kick()
}

// busy reports whether live runs want the machine: the filler waits then.
func (p *Pool) busy() bool {
	a := p.m.admission
	return a.Waiting() > 0 || a.InUse() >= a.Slots()
}

// fill keeps the pool full, one sandbox at a time, yielding to live runs
// and backing off when creation fails.
func (p *Pool) fill() {
	defer p.wg.Done()
	failures := 0
	for {
		select {
		case <-p.done:
			return
		case <-p.wake:
		case <-time.After(time.Second):
		}
		p.retireStale()
		for _, key := range p.keys {
			for p.missing(key) > 0 {
				if p.stopping() {
					return
				}
				if p.busy() {
					break
				}
				if err := p.warmOne(key); err != nil {
					failures++
					wait := min(time.Duration(1<<min(failures, 5))*time.Second, 30*time.Second)
					p.m.o.Log.Warn("warm sandbox failed; cold starts meanwhile", "network", key, "err", err, "retry_in", wait)
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
}

func (p *Pool) missing(key bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size - len(p.ready[key])
}

func (p *Pool) stopping() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// warmOne makes one pooled sandbox and waits for its driver to be ready.
func (p *Pool) warmOne(networked bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	sid := "w" + runtime.NewRunID()[1:]
	var s *sandbox
	if t := p.m.templateFor(networked, p.limits); t != nil {
		s, _ = p.m.restoreWarm(ctx, t, sid, true, p.limits) // failed: it boots
	}
	if s != nil {
		p.setCPUShares(s.id, cpuSharesIdle)
	} else {
		var err error
		if s, err = p.m.create(ctx, sid, true, networked, p.limits); err != nil {
			return err
		}
		p.setCPUShares(s.id, cpuSharesIdle)
		h, err := s.waitHello(ctx)
		if err != nil {
			// Created but never ready: the sandbox did not start. (A preload
			// that fails is the configuration's fault and opens nothing.)
			p.m.breaker.Fail(fmt.Errorf("start pooled sandbox: %w", err))
		} else if !h.Preloaded {
			err = errString("worker preload failed: " + h.PreloadError)
		}
		if err != nil {
			p.retire(s)
			return err
		}
	}
	if _, err := s.container.SetLabels(namespaces.WithNamespace(ctx, p.m.o.Namespace), map[string]string{LabelPool: "idle"}); err != nil {
		p.retire(s)
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		p.retire(s)
		return nil
	}
	p.ready[networked] = append(p.ready[networked], &pooled{s: s, readyAt: time.Now()})
	return nil
}

// retireStale destroys sandboxes that waited longer than maxIdle.
func (p *Pool) retireStale() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, list := range p.ready {
		kept := list[:0]
		for _, e := range list {
			if time.Since(e.readyAt) > p.maxIdle {
				p.retire(e.s)
				continue
			}
			kept = append(kept, e)
		}
		p.ready[key] = kept
	}
}

// stop ends filling and destroys the sandboxes waiting.
func (p *Pool) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.mu.Unlock()
	close(p.done)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, list := range p.ready {
		for _, e := range list {
			p.retire(e.s)
		}
		delete(p.ready, key)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// setCPUShares weights sandbox id's host CPU share; a failure costs only
// fairness, so it is logged, not returned.
func (p *Pool) setCPUShares(id string, shares int) {
	if err := setCPUShares(p.m.o.DeploymentID, id, shares); err != nil {
		p.m.o.Log.Debug("cpu shares", "sandbox", id, "err", err)
	}
}
