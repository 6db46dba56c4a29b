package runtime

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestKilledBy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		exit     int
		session  bool
		marked   bool
		wantExit int
	}{
		{"no error", nil, 0, false, true, 137},
		{"exit kept", nil, 1, true, true, 1},
		{"infrastructure error", errors.New("exchange: EOF"), 0, false, true, 137},
		{"cancelled", fmt.Errorf("run: %w", context.Canceled), 0, true, false, 0},
		{"deadline", context.DeadlineExceeded, 0, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Result{ExitCode: tc.exit, TimedOut: true}
			if got := r.KilledBy(ReasonTripwire, tc.session, tc.err); got != tc.marked {
				t.Fatalf("KilledBy = %v, want %v", got, tc.marked)
			}
			if r.ExitCode != tc.wantExit {
				t.Errorf("exit %d, want %d", r.ExitCode, tc.wantExit)
			}
			if tc.marked && (r.Reason != ReasonTripwire || r.TimedOut || r.SessionLost != tc.session) {
				t.Errorf("marked result: %+v", r)
			}
			if !tc.marked && (r.Reason != "" || !r.TimedOut) {
				t.Errorf("a caller's ending was overwritten: %+v", r)
			}
		})
	}
}

func TestTargets(t *testing.T) {
	var ts Targets[*int]
	a, b := new(int), new(int)
	forgetA := ts.Arm("run1", a)
	if got, ok := ts.Get("run1"); !ok || got != a {
		t.Fatalf("Get after Arm = %v, %v", got, ok)
	}
	// Re-armed: the first registration's forget must not remove the second.
	forgetB := ts.Arm("run1", b)
	forgetA()
	if got, ok := ts.Get("run1"); !ok || got != b {
		t.Fatalf("stale forget removed the new target: %v, %v", got, ok)
	}
	forgetB()
	if _, ok := ts.Get("run1"); ok {
		t.Fatal("target still armed after forget")
	}
	if _, ok := ts.Get("never"); ok {
		t.Fatal("an id never armed has a target")
	}
}
