package approval

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Board is where the replicas of one deployment post their requests, so
// that any replica can answer them:
//   - a request waiting on the console shows on every replica's console
//     (and `airlock approvals` against it); the replica that posted it
//     keeps it in its own Ledger and its caller waits there, and a decision
//     made on another replica reaches it through Decisions;
//   - a question sent back to a stateless client as an input request may
//     come back, answered, in a retry to any replica: that replica claims
//     it on the board, once, and runs the call.
//
// A Gate without a Board is one process alone, as on a single host.
type Board interface {
	// Post shows v on every replica's console until it is removed or
	// expires.
	Post(ctx context.Context, v PendingView) error
	// Remove takes a request this replica posted off the board.
	Remove(ctx context.Context, id string) error
	// Waiting lists the requests posted by any replica and not decided.
	Waiting(ctx context.Context) ([]PendingView, error)
	// Decide records an answer to a request another replica posted, once:
	// ErrUnknown, ErrExpired and ErrAlreadyDecided as Ledger.Decide.
	Decide(ctx context.Context, id string, approve bool, approver string, at time.Time) error
	// Decisions calls f with each answer recorded for a request this
	// replica posted, until ctx ends.
	Decisions(ctx context.Context, f func(id string, approve bool, approver string, at time.Time))
	// Claim hands a round-trip request posted by any replica to the retry
	// that presents it, once, with Ledger.Claim's rules and errors, and
	// returns it.
	Claim(ctx context.Context, id, client, digest string, at time.Time) (PendingView, error)
	// Abandon marks a round-trip request this replica posted as expired
	// unless a retry claimed it, reports whether it did, and takes it off
	// the board. A request not on the board reads as abandoned.
	Abandon(ctx context.Context, id string) (bool, error)
}

// boardTimeout bounds one call to the board: a console must answer, and a
// request that cannot be posted still waits on this replica's console.
const boardTimeout = 10 * time.Second

// UseBoard makes g share its console requests through b until ctx ends.
// Call it before the first request is opened.
func (g *Gate) UseBoard(ctx context.Context, b Board, log *slog.Logger) {
	g.mu.Lock()
	g.board, g.boardLog = b, log
	g.mu.Unlock()
	go b.Decisions(ctx, func(id string, approve bool, approver string, at time.Time) {
		p := g.ledger.Get(id)
		if p == nil || p.Info.Channel != ChannelConsole {
			return
		}
		// A board may deliver an answer twice; the first one counts.
		if err := g.ledger.Decide(id, approve, approver, at); err != nil && !errors.Is(err, ErrAlreadyDecided) {
			log.Warn("a decision from another replica did not apply", "approval_ref", Ref(id), "err", err)
		}
	})
}

// post shows a console request on the board and takes it off once it is
// decided, whoever decided it. A round-trip request stays until Abandon:
// its claim, not its decision, is what the replicas must agree on.
func (g *Gate) post(p *Pending) {
	b, log := g.boardOf()
	if b == nil || !(p.Info.Channel == ChannelConsole || p.Info.RoundTrip) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
	err := b.Post(ctx, View(p))
	cancel()
	if err != nil {
		log.Warn("approval request not shared with the other replicas; only this replica can answer it", "approval_ref", Ref(p.ID), "err", err)
		return
	}
	if p.Info.RoundTrip {
		return
	}
	go func() {
		<-p.done
		ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
		defer cancel()
		if err := b.Remove(ctx, p.ID); err != nil {
			log.Warn("remove a decided request from the board", "approval_ref", Ref(p.ID), "err", err)
		}
	}()
}

func (g *Gate) boardOf() (Board, *slog.Logger) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.board, g.boardLog
}

// Views returns what waits on the console: this replica's requests and,
// with a board, every other replica's, oldest first.
func (g *Gate) Views(ctx context.Context) ([]PendingView, error) {
	var out []PendingView
	local := map[string]bool{}
	for _, p := range g.Pending() {
		out = append(out, View(p))
		local[p.ID] = true
	}
	b, _ := g.boardOf()
	if b == nil {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, boardTimeout)
	defer cancel()
	shared, err := b.Waiting(ctx)
	if err != nil {
		return out, fmt.Errorf("the other replicas' requests: %w", err)
	}
	now := g.ledger.now()
	for _, v := range shared {
		if !local[v.ID] && now.Before(v.Expires) {
			out = append(out, v)
		}
	}
	sortViews(out)
	return out, nil
}

// decideShared records an answer on the board, so that of two approvers
// on two replicas exactly one is taken, and applies it here when the
// request is this replica's (p; nil for another replica's, whose ledger
// hears it through Decisions). A request the board does not hold was
// never posted, and only this replica's ledger decides it.
func (g *Gate) decideShared(b Board, p *Pending, id string, approve bool, approver string) error {
	ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
	defer cancel()
	now := g.ledger.now()
	err := b.Decide(ctx, id, approve, approver, now)
	switch {
	case err == nil && p != nil:
		err := g.ledger.Decide(id, approve, approver, now)
		if d, ok := p.Decided(); errors.Is(err, ErrAlreadyDecided) && ok && d.Approver == approver && d.Approved == approve {
			return nil // Decisions delivered it first
		}
		return err
	case err == nil:
		return nil
	case p != nil && errors.Is(err, ErrUnknown):
		return g.ledger.Decide(id, approve, approver, now)
	case errors.Is(err, ErrUnknown), errors.Is(err, ErrExpired), errors.Is(err, ErrAlreadyDecided):
		return err
	case p != nil:
		// The board is unreachable, so no other replica can decide it
		// either.
		g.boardLog.Warn("deciding without the board", "approval_ref", Ref(id), "err", err)
		return g.ledger.Decide(id, approve, approver, now)
	default:
		return fmt.Errorf("deciding %s on the board: %w", Ref(id), err)
	}
}

// Claim hands the round-trip request id to the retry that presents it,
// once across all replicas: with a board, the board decides who claimed
// it first, whichever replica posted it; without one, the ledger alone.
func (g *Gate) Claim(id, client, digest string) (*Pending, error) {
	b, log := g.boardOf()
	if b == nil {
		return g.ledger.Claim(id, client, digest)
	}
	ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
	defer cancel()
	v, err := b.Claim(ctx, id, client, digest, g.ledger.now())
	local := g.ledger.Get(id)
	switch {
	case err == nil && local != nil:
		// Posted here: the board said this retry is the first. It stays
		// there, claimed, until it would have expired, so that a second
		// retry on any replica is told it was used.
		time.AfterFunc(time.Until(local.Expires), func() {
			ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
			defer cancel()
			if err := b.Remove(ctx, id); err != nil {
				log.Warn("remove a claimed request from the board", "approval_ref", Ref(id), "err", err)
			}
		})
		return g.ledger.Claim(id, client, digest)
	case err == nil:
		return g.ledger.Adopt(v), nil
	case errors.Is(err, ErrUnknown) && local != nil:
		// Never posted (the board was down when it was asked): only this
		// replica knows it.
		return g.ledger.Claim(id, client, digest)
	case errors.Is(err, ErrUnknown), errors.Is(err, ErrConsumed), errors.Is(err, ErrExpired):
		return nil, err
	case errors.Is(err, ErrChanged):
		if local != nil {
			_, _ = g.ledger.Claim(id, client, digest) // denies it here too
		}
		return nil, err
	default:
		if local != nil {
			// The board is unreachable, so no other replica can claim it
			// either.
			log.Warn("claim without the board", "approval_ref", Ref(id), "err", err)
			return g.ledger.Claim(id, client, digest)
		}
		return nil, fmt.Errorf("approval %s: the other replicas' requests: %w", Ref(id), err)
	}
}

// Abandon denies p as expired unless a retry claimed it, on this replica
// or, with a board, any replica, and reports whether it did: the caller
// then records the expiry, exactly once.
func (g *Gate) Abandon(p *Pending) bool {
	b, log := g.boardOf()
	if b != nil && p.Info.RoundTrip {
		ctx, cancel := context.WithTimeout(context.Background(), boardTimeout)
		ok, err := b.Abandon(ctx, p.ID)
		cancel()
		switch {
		case err != nil:
			log.Warn("abandon without the board: if another replica claimed the request, two records may exist", "approval_ref", Ref(p.ID), "err", err)
		case !ok:
			g.ledger.Abandon(p) // settled here as well; the claimer records it
			return false
		}
	}
	return g.ledger.Abandon(p)
}
