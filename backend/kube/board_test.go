package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/airlock-mcp/airlock/approval"
)

// The board's rules, on a fake clientset (the cluster test shows two
// replicas using it): a request is listed until decided, decided once,
// never after it expired, and its poster hears the answer.
func TestBoardRules(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	poster := &Board{client: cs, namespace: "ns", instance: "a", log: log,
		owner: metav1.OwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: "airlock-a", UID: "u"}}
	other := &Board{client: cs, namespace: "ns", instance: "b", log: log}
	now := time.Now()
	live := approval.PendingView{ID: "0123abcd", Tool: "run_python", Code: "print(1)", Created: now, Expires: now.Add(time.Minute)}
	old := approval.PendingView{ID: "4567ef01", Tool: "run_shell", Created: now, Expires: now.Add(-time.Second)}
	for _, v := range []approval.PendingView{live, old} {
		if err := poster.Post(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 4)
	go poster.Decisions(ctx, func(id string, approve bool, approver string, _ time.Time) {
		if approve {
			got <- id + " approved by " + approver
		}
	})
	if w, err := other.Waiting(ctx); err != nil || len(w) != 2 {
		t.Fatalf("waiting: %d %v, want both", len(w), err)
	}
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"nope", approval.ErrUnknown},
		{old.ID, approval.ErrExpired},
		{live.ID, nil},
		{live.ID, approval.ErrAlreadyDecided},
	} {
		if err := other.Decide(ctx, tc.id, true, "console:bob", time.Now()); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("decide %s: %v, want %v", tc.id, err, tc.want)
		}
	}
	select {
	case s := <-got:
		if s != live.ID+" approved by console:bob" {
			t.Errorf("the poster heard %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the poster never heard the decision")
	}
	if w, _ := other.Waiting(ctx); len(w) != 1 || w[0].ID != old.ID {
		t.Errorf("waiting after the decision: %+v, want only the expired one (its poster removes it)", w)
	}
	if err := poster.Remove(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if w, _ := other.Waiting(ctx); len(w) != 0 {
		t.Errorf("waiting after remove: %+v", w)
	}
}

// A round-trip request on the cluster's board: claimed once by a retry on
// any replica, never by another client, never with other arguments, never
// after its poster let it expire; it is not on any console.
func TestBoardClaimRules(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Now()
	view := approval.PendingView{ID: "89abcdef", Tool: "run_python", Client: "alice", Digest: "d1", RoundTrip: true, Created: now, Expires: now.Add(time.Minute)}
	type step struct {
		by, client, digest string // by: "b" claims, "a" abandons
		want               error
		abandoned          bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"claimed once", []step{{by: "b", client: "alice", digest: "d1"}, {by: "b", client: "alice", digest: "d1", want: approval.ErrConsumed}, {by: "a"}}},
		{"another client", []step{{by: "b", client: "mallory", digest: "d1", want: approval.ErrUnknown}, {by: "a", abandoned: true}}},
		{"other arguments", []step{{by: "b", client: "alice", digest: "d2", want: approval.ErrChanged}, {by: "b", client: "alice", digest: "d1", want: approval.ErrConsumed}, {by: "a"}}},
		{"expired first", []step{{by: "a", abandoned: true}, {by: "b", client: "alice", digest: "d1", want: approval.ErrUnknown}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			a := &Board{client: cs, namespace: "ns", instance: "a", log: log}
			b := &Board{client: cs, namespace: "ns", instance: "b", log: log}
			if err := a.Post(ctx, view); err != nil {
				t.Fatal(err)
			}
			if w, err := b.Waiting(ctx); err != nil || len(w) != 0 {
				t.Fatalf("a round-trip request is on the consoles: %+v %v", w, err)
			}
			if err := b.Decide(ctx, view.ID, true, "console:bob", time.Now()); !errors.Is(err, approval.ErrUnknown) {
				t.Errorf("a console decided a round-trip request: %v", err)
			}
			for i, s := range tc.steps {
				if s.by == "a" {
					if ok, err := a.Abandon(ctx, view.ID); err != nil || ok != s.abandoned {
						t.Errorf("step %d: abandon = %v %v, want %v", i, ok, err, s.abandoned)
					}
					continue
				}
				got, err := b.Claim(ctx, view.ID, s.client, s.digest, time.Now())
				if !errors.Is(err, s.want) && !(err == nil && s.want == nil) {
					t.Fatalf("step %d: claim: %v, want %v", i, err, s.want)
				}
				if err == nil && (got.ID != view.ID || got.Digest != "d1") {
					t.Errorf("step %d: claimed %+v", i, got)
				}
			}
			if l, _ := cs.CoreV1().ConfigMaps("ns").List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
				t.Errorf("the poster's expiry left %d config maps", len(l.Items))
			}
		})
	}
}
