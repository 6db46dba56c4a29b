package runtime

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// BreakerOptions configure the circuit breaker in front of sandbox creation.
type BreakerOptions struct {
	// Failures within Window open the breaker; 0 turns it off.
	Failures int
	Window   time.Duration
	// Cooldown is how long an open breaker refuses before it lets one
	// probe creation through.
	Cooldown time.Duration
}

// Breaker stops sandbox creation from being hammered while it keeps
// failing: after Failures infrastructure failures within Window it opens,
// and calls fail at once with CircuitOpenError. After Cooldown one call is
// let through as a probe (half-open): its success closes the breaker, its
// failure opens it for another Cooldown. Only the runtime's own failures
// count (creating or starting a sandbox); what user code does never does.
type Breaker struct {
	o   BreakerOptions
	now func() time.Time

	mu       sync.Mutex
	failures []time.Time
	open     bool
	openedAt time.Time
	probing  bool
	reason   string
}

// NewBreaker returns a closed breaker.
func NewBreaker(o BreakerOptions) *Breaker {
	return &Breaker{o: o, now: time.Now}
}

// CircuitOpenError is returned instead of creating a sandbox while the
// breaker is open.
type CircuitOpenError struct {
	// RetryIn is how long until the breaker lets a probe through.
	RetryIn time.Duration
	// Reason is the last infrastructure failure, short.
	Reason string
}

func (e *CircuitOpenError) Error() string {
	return fmt.Sprintf("circuit breaker open after repeated sandbox failures (last: %s); retry in %s", e.Reason, e.RetryIn.Round(time.Second))
}

// Allow asks to create a sandbox. When it may, done must be called with
// the outcome: nil for success, the error of an infrastructure failure, or
// ErrNotCounted when the attempt says nothing of the runtime's health (its
// caller gave up).
func (b *Breaker) Allow() (done func(error), err error) {
	if b == nil || b.o.Failures <= 0 {
		return func(error) {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	probe := false
	if b.open {
		wait := b.o.Cooldown - b.now().Sub(b.openedAt)
		if wait > 0 || b.probing {
			return nil, &CircuitOpenError{RetryIn: max(wait, time.Second), Reason: b.reason}
		}
		b.probing, probe = true, true
	}
	var once sync.Once
	return func(err error) { once.Do(func() { b.report(probe, err) }) }, nil
}

// ErrNotCounted tells done that the attempt says nothing of the runtime's
// health (the caller gave up): a probe is released, nothing is counted.
var ErrNotCounted = fmt.Errorf("not counted")

func (b *Breaker) report(probe bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe {
		b.probing = false
	}
	switch {
	case err == ErrNotCounted:
	case err == nil:
		// Creation works: the breaker closes and forgets.
		b.open, b.failures, b.reason = false, b.failures[:0], ""
	default:
		b.failLocked(err)
	}
}

// Fail counts an infrastructure failure seen after creation (a pooled
// sandbox whose driver never became ready).
func (b *Breaker) Fail(err error) {
	if b == nil || b.o.Failures <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failLocked(err)
}

func (b *Breaker) failLocked(err error) {
	now := b.now()
	b.reason = shortReason(err)
	if b.open {
		// A failed probe: another full cooldown.
		b.openedAt = now
		return
	}
	kept := b.failures[:0]
	for _, t := range b.failures {
		if now.Sub(t) < b.o.Window {
			kept = append(kept, t)
		}
	}
	b.failures = append(kept, now)
	if len(b.failures) >= b.o.Failures {
		b.open, b.openedAt = true, now
	}
}

// ProbeNow lets an open breaker probe at the next call, without waiting
// out its cooldown: the runtime was just restarted.
func (b *Breaker) ProbeNow() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open {
		b.openedAt = b.now().Add(-b.o.Cooldown)
	}
}

// Open reports whether the breaker is refusing (open or half-open).
func (b *Breaker) Open() bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// shortReason keeps a failure's text short enough to show a caller.
func shortReason(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Guard runs create through the breaker: refused at once while the
// breaker is open; create's failure counts, unless the caller gave up (ctx
// ended), which says nothing of the runtime.
func (b *Breaker) Guard(ctx context.Context, create func() error) error {
	done, err := b.Allow()
	if err != nil {
		return err
	}
	err = create()
	switch {
	case err == nil:
		done(nil)
	case ctx.Err() != nil:
		done(ErrNotCounted)
	default:
		done(err)
	}
	return err
}
