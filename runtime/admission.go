package runtime

import (
	"context"
	"sync/atomic"
	"time"
)

// Admission bounds how many sandboxes run at once. A run takes a slot if
// one is free; otherwise it may wait in a bounded queue for at most a set
// time. When the queue is full the answer is ErrBusy at once, so a flood of
// calls gets fast refusals instead of piling up.
type Admission struct {
	slots   chan struct{}
	queue   int64
	waiting atomic.Int64
	maxWait time.Duration
}

// NewAdmission allows slots runs at once and up to queue more to wait for
// at most maxWait each. slots below 1 count as 1.
func NewAdmission(slots, queue int, maxWait time.Duration) *Admission {
	if slots < 1 {
		slots = 1
	}
	if queue < 0 {
		queue = 0
	}
	return &Admission{slots: make(chan struct{}, slots), queue: int64(queue), maxWait: maxWait}
}

// Acquire takes a slot, waiting in the queue if there is room. It returns
// ErrBusy when the queue is full or the wait ran out, and ctx's error when
// the caller gave up. Release the slot with the returned function.
func (a *Admission) Acquire(ctx context.Context) (release func(), err error) {
	release = func() { <-a.slots }
	select {
	case a.slots <- struct{}{}:
		return release, nil
	default:
	}
	if a.waiting.Add(1) > a.queue {
		a.waiting.Add(-1)
		return nil, ErrBusy
	}
	defer a.waiting.Add(-1)
	timer := time.NewTimer(a.maxWait)
	defer timer.Stop()
	select {
	case a.slots <- struct{}{}:
		return release, nil
	case <-timer.C:
		return nil, ErrBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// InUse is the number of slots taken; Waiting the number of runs queued.
func (a *Admission) InUse() int { return len(a.slots) }

// Waiting is the number of runs waiting for a slot.
func (a *Admission) Waiting() int { return int(a.waiting.Load()) }

// Slots is how many runs may hold a slot at once.
func (a *Admission) Slots() int { return cap(a.slots) }
