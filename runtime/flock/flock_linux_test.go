package flock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestLockExcludesAndReleases(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := Lock(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, p); err == nil {
		t.Fatal("second Lock succeeded while the first was held")
	}
	unlock()
	unlock2, err := Lock(context.Background(), p)
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	unlock2()
}

func TestTryLockTakesAFreeLockOnlyOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := TryLock(p)
	if err != nil {
		t.Fatalf("TryLock of a free lock: %v", err)
	}
	if _, err := TryLock(p); !errors.Is(err, ErrHeld) {
		t.Fatalf("TryLock of a held lock: %v, want ErrHeld", err)
	}
	unlock()
	unlock, err = TryLock(p)
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	unlock()
}
