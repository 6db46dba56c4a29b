package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// clock is a settable time for the breaker.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newTestBreaker(c *clock) *Breaker {
	b := NewBreaker(BreakerOptions{Failures: 3, Window: time.Minute, Cooldown: 30 * time.Second})
	b.now = c.now
	return b
}

// attempt asks the breaker and reports the outcome; it returns whether the
// breaker let the attempt through.
func attempt(t *testing.T, b *Breaker, outcome error) bool {
	t.Helper()
	done, err := b.Allow()
	if err != nil {
		var co *CircuitOpenError
		if !errors.As(err, &co) || co.RetryIn <= 0 || co.Reason == "" {
			t.Fatalf("Allow refused with %v; want a CircuitOpenError with a reason and a retry time", err)
		}
		return false
	}
	done(outcome)
	return true
}

func TestBreaker(t *testing.T) {
	boom := errors.New("create sandbox: runsc: exit status 1")
	c := &clock{t: time.Unix(1e9, 0)}

	t.Run("failures spread wider than the window never open it", func(t *testing.T) {
		b := newTestBreaker(c)
		for i := 0; i < 10; i++ {
			if !attempt(t, b, boom) {
				t.Fatalf("attempt %d refused; failures were %s apart", i, 40*time.Second)
			}
			c.advance(40 * time.Second)
		}
	})

	t.Run("a success in between resets the count", func(t *testing.T) {
		b := newTestBreaker(c)
		for i := 0; i < 6; i++ {
			outcome := boom
			if i%2 == 1 {
				outcome = nil
			}
			if !attempt(t, b, outcome) {
				t.Fatalf("attempt %d refused", i)
			}
		}
	})

	t.Run("uncounted outcomes do not count", func(t *testing.T) {
		b := newTestBreaker(c)
		for i := 0; i < 10; i++ {
			if !attempt(t, b, ErrNotCounted) {
				t.Fatalf("attempt %d refused", i)
			}
		}
	})

	t.Run("opens, refuses, one probe, closes", func(t *testing.T) {
		b := newTestBreaker(c)
		for i := 0; i < 3; i++ {
			attempt(t, b, boom)
		}
		if !b.Open() || attempt(t, b, nil) {
			t.Fatal("three failures within the window did not open the breaker")
		}
		c.advance(31 * time.Second)
		done, err := b.Allow()
		if err != nil {
			t.Fatalf("after the cooldown the probe was refused: %v", err)
		}
		if attempt(t, b, nil) {
			t.Fatal("a second call got through while the probe was out")
		}
		done(boom) // the probe failed: another cooldown
		c.advance(10 * time.Second)
		if attempt(t, b, nil) {
			t.Fatal("a failed probe did not reopen the breaker")
		}
		c.advance(25 * time.Second)
		if !attempt(t, b, nil) || b.Open() {
			t.Fatal("a successful probe did not close the breaker")
		}
		// Closed and forgotten: it takes three new failures to open again.
		attempt(t, b, boom)
		attempt(t, b, boom)
		if b.Open() {
			t.Fatal("old failures were remembered after closing")
		}
	})

	t.Run("an abandoned probe frees the next", func(t *testing.T) {
		b := newTestBreaker(c)
		for i := 0; i < 3; i++ {
			attempt(t, b, boom)
		}
		c.advance(31 * time.Second)
		attempt(t, b, ErrNotCounted)
		if !attempt(t, b, nil) {
			t.Fatal("after an abandoned probe the next call was not let through as a probe")
		}
	})

	t.Run("off", func(t *testing.T) {
		b := NewBreaker(BreakerOptions{})
		for i := 0; i < 20; i++ {
			attempt(t, b, boom)
		}
		var nilB *Breaker
		nilB.Fail(boom)
		if b.Open() || nilB.Open() {
			t.Fatal("a breaker with Failures 0 opened")
		}
	})
}

// Guard counts a creation's failure only when the caller had not given up.
func TestBreakerGuard(t *testing.T) {
	boom := errors.New("create sandbox pod: the API server refused")
	c := &clock{t: time.Unix(1e9, 0)}
	b := newTestBreaker(c)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 5; i++ {
		if err := b.Guard(gone, func() error { return boom }); err != boom {
			t.Fatalf("Guard = %v, want the creation's own error", err)
		}
	}
	if b.Open() {
		t.Fatal("failures of callers that gave up opened the breaker")
	}
	for i := 0; i < 3; i++ {
		_ = b.Guard(context.Background(), func() error { return boom })
	}
	if !b.Open() {
		t.Fatal("three counted failures did not open the breaker")
	}
	ran := false
	var co *CircuitOpenError
	if err := b.Guard(context.Background(), func() error { ran = true; return nil }); !errors.As(err, &co) || ran {
		t.Fatalf("open breaker: err %v, ran %v; want a refusal without running", err, ran)
	}
}
