package approval

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestLedger() (*Ledger, *fakeClock) {
	c := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	l := NewLedger()
	l.now = c.Now
	return l, c
}

const zeros8 = "\x00\x00\x00\x00\x00\x00\x00\x00"

func sampleRequest() Request {
	return Request{
		Tool:         "run_python",
		Code:         "print(1)",
		Limits:       Limits{TimeoutS: 30, MemoryMB: 256},
		Network:      "allowlist",
		AllowDomains: []string{"pypi.org", "files.pythonhosted.org"},
		Session:      "",
		Client:       "claude-desktop",
	}
}

func TestDigestDiffers(t *testing.T) {
	base := sampleRequest()
	tests := []struct {
		name string
		a, b Request
	}{
		{"tool/code boundary", Request{Tool: "ab", Code: "c"}, Request{Tool: "a", Code: "bc"}},
		// Collides under an encoding with field tags but no real lengths:
		// the next field's tag and header bytes moved into the previous one.
		{"tag bytes inside a field", Request{Tool: "a\x02" + zeros8, Code: "b"}, Request{Tool: "a", Code: "\x02" + zeros8 + "b"}},
		{"code/network boundary", Request{Code: "x", Network: "none"}, Request{Code: "xn", Network: "one"}},
		{"domain boundary", Request{AllowDomains: []string{"ab", "c"}}, Request{AllowDomains: []string{"a", "bc"}}},
		{"domain list vs session", Request{AllowDomains: []string{"a"}}, Request{Session: "a"}},
		{"empty domain counts", Request{AllowDomains: []string{""}}, Request{}},
		{"changed code", base, func() Request { r := sampleRequest(); r.Code = "print(2)"; return r }()},
		{"changed timeout", base, func() Request { r := sampleRequest(); r.Limits.TimeoutS = 31; return r }()},
		{"timeout vs memory", Request{Limits: Limits{TimeoutS: 1}}, Request{Limits: Limits{MemoryMB: 1}}},
		{"extra domain", base, func() Request { r := sampleRequest(); r.AllowDomains = append(r.AllowDomains, "evil.com"); return r }()},
		{"changed client", base, func() Request { r := sampleRequest(); r.Client = "other"; return r }()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.a.Digest() == tt.b.Digest() {
				t.Errorf("%+v and %+v share digest %s", tt.a, tt.b, tt.a.Digest())
			}
		})
	}
}

func TestDigestStable(t *testing.T) {
	a := sampleRequest()
	b := sampleRequest()
	b.AllowDomains = []string{"files.pythonhosted.org", "pypi.org"}
	if a.Digest() != b.Digest() {
		t.Errorf("domain order changed the digest")
	}
	if d := a.Digest(); len(d) != 64 {
		t.Errorf("digest %q is not 64 hex characters", d)
	}
	if a.AllowDomains[0] != "pypi.org" {
		t.Errorf("Digest sorted the caller's slice: %q", a.AllowDomains)
	}
}

func TestSingleUse(t *testing.T) {
	l, c := newTestLedger()
	p := l.Open(sampleRequest(), time.Minute)
	if err := l.Decide(p.ID, true, "alice", c.Now()); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	d, err := p.Wait(context.Background())
	if err != nil || !d.Approved || d.Approver != "alice" || d.Digest != p.Digest || d.ID != p.ID {
		t.Fatalf("first Wait = %+v, %v; want approved by alice for %s", d, err, p.ID)
	}
	if _, err := p.Wait(context.Background()); !errors.Is(err, ErrConsumed) {
		t.Errorf("second Wait err = %v, want ErrConsumed", err)
	}
	// The same request again is a new Pending that nobody approved.
	q := l.Open(sampleRequest(), time.Minute)
	if q.ID == p.ID {
		t.Fatalf("second Open reused id %s", p.ID)
	}
	if q.Digest != p.Digest {
		t.Errorf("identical requests got digests %s and %s", p.Digest, q.Digest)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := q.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on undecided replay err = %v, want deadline exceeded", err)
	}
}

func TestDecideErrors(t *testing.T) {
	l, c := newTestLedger()
	p := l.Open(sampleRequest(), time.Minute)
	if err := l.Decide("nope", true, "alice", c.Now()); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown id err = %v, want ErrUnknown", err)
	}
	if err := l.Decide(p.ID, false, "alice", c.Now()); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if err := l.Decide(p.ID, true, "mallory", c.Now()); !errors.Is(err, ErrAlreadyDecided) {
		t.Errorf("second Decide err = %v, want ErrAlreadyDecided", err)
	}
	d, err := p.Wait(context.Background())
	if err != nil || d.Approved || d.Approver != "alice" {
		t.Errorf("Wait = %+v, %v; want the first (denial) to stand", d, err)
	}
}

func TestDecideAfterExpiry(t *testing.T) {
	l, c := newTestLedger()
	p := l.Open(sampleRequest(), time.Minute)
	q := l.Open(sampleRequest(), time.Minute)
	// Decided with a timestamp past expiry.
	if err := l.Decide(p.ID, true, "alice", c.Now().Add(time.Minute)); !errors.Is(err, ErrExpired) {
		t.Errorf("late Decide err = %v, want ErrExpired", err)
	}
	d, err := p.Wait(context.Background())
	if err != nil || d.Approved || d.Reason != ReasonExpired {
		t.Errorf("Wait = %+v, %v; want denial with reason expired", d, err)
	}
	// Expired by the clock before anyone answered: swept, still ErrExpired.
	c.Add(2 * time.Minute)
	if err := l.Decide(q.ID, true, "alice", c.Now().Add(-90*time.Second)); !errors.Is(err, ErrExpired) {
		t.Errorf("Decide after sweep err = %v, want ErrExpired", err)
	}
	if n := len(l.List("")); n != 0 {
		t.Errorf("List after expiry has %d entries, want 0", n)
	}
	// Long after, entries are forgotten entirely.
	c.Add(time.Hour)
	l.Open(sampleRequest(), time.Minute)
	if n := l.Len(); n != 1 {
		t.Errorf("Len after retention = %d, want 1 (old entries swept)", n)
	}
}

func TestWaitExpiresByTimer(t *testing.T) {
	l := NewLedger() // real clock: the timer must fire on its own
	p := l.Open(sampleRequest(), 30*time.Millisecond)
	start := time.Now()
	d, err := p.Wait(context.Background())
	if err != nil || d.Approved || d.Reason != ReasonExpired {
		t.Fatalf("Wait = %+v, %v; want expired denial", d, err)
	}
	if el := time.Since(start); el < 25*time.Millisecond {
		t.Errorf("Wait returned after %v, before the ttl", el)
	}
	if err := l.Decide(p.ID, true, "alice", time.Now()); !errors.Is(err, ErrExpired) {
		t.Errorf("Decide after timer expiry err = %v, want ErrExpired", err)
	}
}

func TestWaitCtxCancel(t *testing.T) {
	l, _ := newTestLedger()
	p := l.Open(sampleRequest(), time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Wait(ctx)
		errc <- err
	}()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Wait err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after cancel")
	}
}

func TestConcurrentIdenticalNeedTwoApprovals(t *testing.T) {
	l, c := newTestLedger()
	var wg sync.WaitGroup
	ps := make([]*Pending, 2)
	for i := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ps[i] = l.Open(sampleRequest(), time.Minute)
		}()
	}
	wg.Wait()
	if ps[0].ID == ps[1].ID {
		t.Fatalf("identical concurrent requests share id %s", ps[0].ID)
	}
	if n := len(l.List("claude-desktop")); n != 2 {
		t.Fatalf("List = %d pending, want 2", n)
	}

	results := make(chan Decision, 2)
	for _, p := range ps {
		go func() {
			d, err := p.Wait(context.Background())
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
			results <- d
		}()
	}
	if err := l.Decide(ps[0].ID, true, "alice", c.Now()); err != nil {
		t.Fatal(err)
	}
	first := <-results
	if !first.Approved || first.ID != ps[0].ID {
		t.Fatalf("first decision = %+v, want approval of %s", first, ps[0].ID)
	}
	select {
	case d := <-results:
		t.Fatalf("second request resolved by the first approval: %+v", d)
	case <-time.After(30 * time.Millisecond):
	}
	if err := l.Decide(ps[1].ID, true, "alice", c.Now()); err != nil {
		t.Fatal(err)
	}
	if second := <-results; !second.Approved || second.ID != ps[1].ID {
		t.Errorf("second decision = %+v, want approval of %s", second, ps[1].ID)
	}
}

func TestList(t *testing.T) {
	l, c := newTestLedger()
	a := sampleRequest()
	b := sampleRequest()
	b.Client = "ide"
	pa := l.Open(a, time.Minute)
	c.Add(time.Second)
	pb := l.Open(b, time.Minute)
	c.Add(time.Second)
	pa2 := l.Open(a, time.Minute)

	if got := ids(l.List("claude-desktop")); !slices.Equal(got, []string{pa.ID, pa2.ID}) {
		t.Errorf("List(claude-desktop) = %v, want [%s %s]", got, pa.ID, pa2.ID)
	}
	if got := ids(l.List("")); !slices.Equal(got, []string{pa.ID, pb.ID, pa2.ID}) {
		t.Errorf("List(\"\") = %v, want all three oldest first", got)
	}
	if err := l.Decide(pa.ID, true, "x", c.Now()); err != nil {
		t.Fatal(err)
	}
	if got := ids(l.List("claude-desktop")); !slices.Equal(got, []string{pa2.ID}) {
		t.Errorf("List after decision = %v, want only %s", got, pa2.ID)
	}
}

func TestOpenCopiesDomains(t *testing.T) {
	l, _ := newTestLedger()
	r := sampleRequest()
	p := l.Open(r, time.Minute)
	r.AllowDomains[0] = "evil.com"
	if p.Request.AllowDomains[0] != "pypi.org" || p.Request.Digest() != p.Digest {
		t.Errorf("changing the caller's slice changed the pending request: %v", p.Request.AllowDomains)
	}
}

func TestLedgerRace(t *testing.T) {
	l, c := newTestLedger()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := l.Open(sampleRequest(), time.Minute)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = p.Wait(context.Background())
			}()
			_ = l.List("")
			errs := make(chan error, 2)
			for j := 0; j < 2; j++ {
				go func() { errs <- l.Decide(p.ID, true, "a", c.Now()) }()
			}
			e1, e2 := <-errs, <-errs
			if (e1 == nil) == (e2 == nil) {
				t.Errorf("two racing Decides returned %v and %v; want exactly one success", e1, e2)
			}
			<-done
		}()
	}
	wg.Wait()
}

func ids(ps []*Pending) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}
