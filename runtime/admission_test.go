package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestAdmission(t *testing.T) {
	a := NewAdmission(2, 1, 200*time.Millisecond)
	ctx := context.Background()
	r1, err1 := a.Acquire(ctx)
	r2, err2 := a.Acquire(ctx)
	if err1 != nil || err2 != nil {
		t.Fatalf("free slots refused: %v %v", err1, err2)
	}
	// Third waits in the queue; a fourth finds the queue full and is refused at once.
	got := make(chan error, 1)
	go func() {
		r, err := a.Acquire(ctx)
		if err == nil {
			r()
		}
		got <- err
	}()
	for a.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if _, err := a.Acquire(ctx); !errors.Is(err, ErrBusy) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("past the queue: %v after %v, want ErrBusy at once", err, time.Since(start))
	}
	r1() // the waiter gets this slot
	if err := <-got; err != nil {
		t.Fatalf("queued run: %v", err)
	}
	// Now both slots are held again (r2 and nobody): wait runs out.
	r3, _ := a.Acquire(ctx)
	start = time.Now()
	if _, err := a.Acquire(ctx); !errors.Is(err, ErrBusy) || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("queued past maxWait: %v after %v, want ErrBusy after about 200ms", err, time.Since(start))
	}
	// A caller that gives up leaves the queue.
	cctx, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := a.Acquire(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if a.Waiting() != 0 || a.InUse() != 2 {
		t.Fatalf("waiting=%d inUse=%d after all returned", a.Waiting(), a.InUse())
	}
	r2()
	r3()
	if a.InUse() != 0 {
		t.Fatalf("slots leaked: %d", a.InUse())
	}
}
