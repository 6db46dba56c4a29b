package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/approval"
)

// Two replicas' gates on the cluster's approval board: a console request
// asked on one is shown and decided on the other, and its caller gets the
// answer through the watch; a stateless client's answered retry is
// claimed on whichever replica it lands, once; a replica that goes takes
// its requests with it (they are owned by its Lease).
func TestApprovalBoardAcrossReplicas(t *testing.T) {
	cs, ns, ma, mb := twoManagers(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, b := approval.NewGate(approval.Policy{}, time.Minute), approval.NewGate(approval.Policy{}, time.Minute)
	a.UseBoard(ctx, ma.Board(), log)
	b.UseBoard(ctx, mb.Board(), log)
	boardOf := func(m *Manager) int {
		t.Helper()
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + m.InstanceID() + "," + LabelApproval})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	req := approval.Request{Tool: "run_python", Client: "alice", Code: "print('across')"}

	// The console: asked on a, decided on b.
	p := a.Open(req, approval.Info{Channel: approval.ChannelConsole})
	views, err := b.Views(ctx)
	if err != nil || len(views) != 1 || views[0].ID != p.ID || views[0].Code != "print('across')" {
		t.Fatalf("b's console shows %+v (%v), want a's request", views, err)
	}
	if err := b.DecideConsole(p.ID, true, "console:bob"); err != nil {
		t.Fatal(err)
	}
	if err := a.DecideConsole(p.ID, false, "console:carol"); !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Errorf("a second answer on a: %v, want ErrAlreadyDecided", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if d, err := p.Wait(wctx); err != nil || !d.Approved || d.Approver != "console:bob" {
		t.Fatalf("a's caller got %+v %v, want approved by console:bob", d, err)
	}
	waitFor(t, 30*time.Second, "the decided request off the board", func() (bool, error) { return boardOf(ma) == 0, nil })

	// The stateless round trip: asked on a, the retry lands on b, a second
	// retry on a is refused, and a records no expiry.
	q := a.Open(req, approval.Info{Channel: approval.ChannelElicitation, RoundTrip: true})
	if v, _ := b.Views(ctx); len(v) != 0 {
		t.Errorf("a round-trip request is on b's console: %+v", v)
	}
	got, err := b.Claim(q.ID, "alice", q.Digest)
	if err != nil || got.ID != q.ID {
		t.Fatalf("the retry on b: %+v %v", got, err)
	}
	if _, err := a.Claim(q.ID, "alice", q.Digest); !errors.Is(err, approval.ErrConsumed) {
		t.Errorf("a second retry on a: %v, want ErrConsumed", err)
	}
	if a.Abandon(q) {
		t.Error("a recorded an expiry for a request b's retry ran")
	}
	if n := boardOf(ma); n != 0 {
		t.Errorf("%d requests left on the board after the expiry", n)
	}

	// A replica that goes takes its waiting requests with it.
	a.Open(req, approval.Info{Channel: approval.ChannelConsole})
	if n := boardOf(ma); n != 1 {
		t.Fatalf("a's console request: %d on the board, want 1", n)
	}
	if err := ma.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "a's requests gone with its Lease", func() (bool, error) { return boardOf(ma) == 0, nil })
	if v, err := b.Views(ctx); err != nil || len(v) != 0 {
		t.Errorf("b's console still shows %+v (%v)", v, err)
	}
}
