package tools

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestQuotas(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := &Quotas{Concurrent: 2, PerMinute: 3, now: func() time.Time { return now }}
	r1, err1 := q.Take("a")
	r2, err2 := q.Take("a")
	if err1 != nil || err2 != nil {
		t.Fatalf("first two: %v %v", err1, err2)
	}
	var qe *QuotaError
	if _, err := q.Take("a"); !errors.As(err, &qe) || !strings.Contains(err.Error(), "per_client_concurrency") {
		t.Fatalf("third concurrent: %v", err)
	}
	if rb, err := q.Take("b"); err != nil {
		t.Fatalf("another client is not limited by a's runs: %v", err)
	} else {
		rb()
	}
	r1()
	r1() // releasing twice frees one slot only
	r3, err := q.Take("a")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	r2()
	r3()
	// 3 per minute: the fourth start within the minute is refused with a wait.
	if _, err := q.Take("a"); !errors.As(err, &qe) || !strings.Contains(err.Error(), "per_client_runs_per_minute") || !strings.Contains(err.Error(), "retry in 20 s") {
		t.Fatalf("fourth in a minute: %v", err)
	}
	now = now.Add(20 * time.Second)
	if r, err := q.Take("a"); err != nil {
		t.Fatalf("after 20 s one token is back: %v", err)
	} else {
		r()
	}
}
