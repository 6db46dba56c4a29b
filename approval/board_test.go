package approval

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// memStore is what a Board shares between replicas, in memory: enough to
// test the Gate's side. The cluster's board has its own tests.
type memStore struct {
	mu      sync.Mutex
	entries map[string]*memEntry
	subs    map[string]chan memDecision // poster → its decisions
}

type memEntry struct {
	view    PendingView
	poster  string
	decided bool
	// A round-trip request is claimed by a retry or expired by its poster.
	claimed, expired bool
}

type memDecision struct {
	id, approver string
	approve      bool
	at           time.Time
}

// memBoard is one replica's handle on a memStore.
type memBoard struct {
	s    *memStore
	name string
}

func newMemStore() *memStore {
	return &memStore{entries: map[string]*memEntry{}, subs: map[string]chan memDecision{}}
}

func (s *memStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

func (s *memStore) board(name string) *memBoard {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs[name] = make(chan memDecision, 16)
	return &memBoard{s: s, name: name}
}

func (b *memBoard) Post(_ context.Context, v PendingView) error {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	b.s.entries[v.ID] = &memEntry{view: v, poster: b.name}
	return nil
}

func (b *memBoard) Remove(_ context.Context, id string) error {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	delete(b.s.entries, id)
	return nil
}

func (b *memBoard) Waiting(context.Context) ([]PendingView, error) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	var out []PendingView
	for _, e := range b.s.entries {
		if !e.decided && !e.view.RoundTrip {
			out = append(out, e.view)
		}
	}
	return out, nil
}

func (b *memBoard) Decide(_ context.Context, id string, approve bool, approver string, at time.Time) error {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	e, ok := b.s.entries[id]
	switch {
	case !ok || e.view.RoundTrip:
		return fmt.Errorf("deciding %q: %w", id, ErrUnknown)
	case e.decided:
		return fmt.Errorf("deciding %s: %w", id, ErrAlreadyDecided)
	case !at.Before(e.view.Expires):
		return fmt.Errorf("deciding %s: %w", id, ErrExpired)
	}
	e.decided = true
	b.s.subs[e.poster] <- memDecision{id: id, approver: approver, approve: approve, at: at}
	return nil
}

func (b *memBoard) Claim(_ context.Context, id, client, digest string, at time.Time) (PendingView, error) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	e, ok := b.s.entries[id]
	switch {
	case !ok || !e.view.RoundTrip || e.view.Client != client:
		return PendingView{}, fmt.Errorf("approval %q: %w", id, ErrUnknown)
	case e.claimed:
		return PendingView{}, fmt.Errorf("approval %s: %w", id, ErrConsumed)
	case e.expired || !at.Before(e.view.Expires):
		return PendingView{}, fmt.Errorf("approval %s: %w", id, ErrExpired)
	}
	e.claimed = true
	if e.view.Digest != digest {
		return PendingView{}, fmt.Errorf("approval %s: %w", id, ErrChanged)
	}
	return e.view, nil
}

func (b *memBoard) Abandon(_ context.Context, id string) (bool, error) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	e, ok := b.s.entries[id]
	if !ok {
		return true, nil
	}
	delete(b.s.entries, id)
	e.expired = !e.claimed
	return e.expired, nil
}

func (b *memBoard) Decisions(ctx context.Context, f func(string, bool, string, time.Time)) {
	b.s.mu.Lock()
	ch := b.s.subs[b.name]
	b.s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-ch:
			f(d.id, d.approve, d.approver, d.at)
		}
	}
}

// twoReplicas is two gates sharing one in-memory board, for the test's
// lifetime.
func twoReplicas(t *testing.T) (context.Context, *memStore, *Gate, *Gate) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := newMemStore()
	a, b := NewGate(Policy{}, time.Minute), NewGate(Policy{}, time.Minute)
	a.UseBoard(ctx, store.board("a"), log)
	b.UseBoard(ctx, store.board("b"), log)
	return ctx, store, a, b
}

// A console request opened on one replica shows on another's console, is
// decided there exactly once, and the caller waiting on the first gets
// the answer; the board forgets it once decided.
func TestBoardSharesConsoleRequests(t *testing.T) {
	ctx, store, a, b := twoReplicas(t)

	p := a.Open(Request{Tool: "run_python", Client: "alice", Code: "print(1)"}, Info{Channel: ChannelConsole})
	views, err := b.Views(ctx)
	if err != nil || len(views) != 1 || views[0].ID != p.ID || views[0].Code != "print(1)" {
		t.Fatalf("b's console shows %+v (%v), want a's request", views, err)
	}
	if err := b.DecideConsole("no-such-id", true, "console:bob"); !errors.Is(err, ErrUnknown) {
		t.Errorf("deciding an unknown id: %v, want ErrUnknown", err)
	}
	if err := b.DecideConsole(p.ID, true, "console:bob"); err != nil {
		t.Fatal(err)
	}
	// A second answer is refused on either replica, the asking one too,
	// even before the first reached it.
	for name, g := range map[string]*Gate{"a": a, "b": b} {
		if err := g.DecideConsole(p.ID, false, "console:carol"); !errors.Is(err, ErrAlreadyDecided) {
			t.Errorf("a second answer on %s: %v, want ErrAlreadyDecided", name, err)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	d, err := p.Wait(wctx)
	if err != nil || !d.Approved || d.Approver != "console:bob" {
		t.Fatalf("a's caller got %+v %v, want approved by console:bob", d, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _ := a.Views(ctx); len(v) == 0 && store.len() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the decided request is still on the board: %d entries", store.len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Only console requests show on the consoles, and an expired one is not
// shown.
func TestBoardShowsOnlyLiveConsoleRequests(t *testing.T) {
	ctx, store, a, b := twoReplicas(t)
	a.Open(Request{Tool: "run_python", Client: "alice", Code: "print(2)"}, Info{Channel: ChannelElicitation})
	a.Open(Request{Tool: "run_python", Client: "alice", Code: "print(3)"}, Info{Channel: ChannelElicitation, RoundTrip: true})
	if v, _ := b.Views(ctx); len(v) != 0 {
		t.Fatalf("an elicitation request is on another replica's console: %+v", v)
	}
	if err := b.DecideConsole(onlyID(t, store), true, "console:bob"); !errors.Is(err, ErrUnknown) {
		t.Errorf("a console decided a round-trip request: %v, want ErrUnknown", err)
	}
	_ = store.board("c").Post(ctx, PendingView{ID: "old", Expires: time.Now().Add(-time.Second)})
	if v, _ := b.Views(ctx); len(v) != 0 {
		t.Fatalf("an expired request is shown: %+v", v)
	}
}

// onlyID is the id of the one request on the board.
func onlyID(t *testing.T, s *memStore) string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.entries) != 1 {
		t.Fatalf("the board holds %d requests, want 1", len(s.entries))
	}
	for id := range s.entries {
		return id
	}
	return ""
}

// A stateless client's retry claims its request on whichever replica it
// lands, exactly once; the replica that asked then records no expiry. A
// retry with other arguments, another client's retry and one after the
// expiry are refused.
func TestBoardRoundTripClaimedOnce(t *testing.T) {
	req := Request{Tool: "run_python", Client: "alice", Code: "print(4)"}
	rt := Info{Channel: ChannelElicitation, RoundTrip: true}
	cases := []struct {
		name string
		// on says which replica each retry lands on ("a" asked).
		on     []string
		client string
		digest string
		want   []error // per retry
		// abandoned: the asking replica records the expiry.
		abandoned bool
	}{
		{name: "retry on the other replica", on: []string{"b"}, want: []error{nil}},
		{name: "retry on the asking replica", on: []string{"a"}, want: []error{nil}},
		{name: "two retries, two replicas", on: []string{"b", "a"}, want: []error{nil, ErrConsumed}},
		{name: "two retries, the asking replica first", on: []string{"a", "b"}, want: []error{nil, ErrConsumed}},
		{name: "other arguments", on: []string{"b", "a"}, digest: "other", want: []error{ErrChanged, ErrConsumed}},
		{name: "another client", on: []string{"b"}, client: "mallory", want: []error{ErrUnknown}, abandoned: true},
		{name: "no retry", abandoned: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, a, b := twoReplicas(t)
			gates := map[string]*Gate{"a": a, "b": b}
			p := a.Open(req, rt)
			client, digest := "alice", p.Digest
			if tc.client != "" {
				client = tc.client
			}
			if tc.digest != "" {
				digest = tc.digest
			}
			for i, on := range tc.on {
				got, err := gates[on].Claim(p.ID, client, digest)
				if !errors.Is(err, tc.want[i]) || (err == nil) != (got != nil) {
					t.Fatalf("retry %d on %s: %v, want %v", i, on, err, tc.want[i])
				}
				if err == nil && (got.ID != p.ID || got.Digest != p.Digest || got.Request.Client != "alice") {
					t.Errorf("retry %d on %s claimed %+v, want a's request", i, on, got)
				}
			}
			if got := a.Abandon(p); got != tc.abandoned {
				t.Errorf("a's expiry: abandoned = %v, want %v", got, tc.abandoned)
			}
			if _, err := b.Claim(p.ID, "alice", p.Digest); err == nil {
				t.Error("a retry after the expiry was honoured")
			}
		})
	}
}
