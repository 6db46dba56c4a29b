package approval

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"slices"
	"sort"
	"sync"
	"time"
)

// Limits are the resource limits a run asks for. They are part of what a
// human approves: the same code with a longer timeout or more memory is a
// different request. Zero means "the configured default".
type Limits struct {
	TimeoutS       int   `json:"timeout_s,omitempty"`
	MemoryMB       int   `json:"memory_mb,omitempty"`
	CPUMillis      int   `json:"cpu_millis,omitempty"`
	Pids           int   `json:"pids,omitempty"`
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// Request is everything about a run that an approval covers. Callers fill it
// with resolved values (the effective network, not ""), so that what was
// approved is what runs.
type Request struct {
	Tool         string
	Code         string
	Limits       Limits
	Network      string
	AllowDomains []string
	Session      string
	Client       string
	// Secrets are the names of the secrets the run is given (never their
	// values): approving a call approves sending them to their hosts.
	Secrets []string
}

// digestVersion starts every encoding so a future change of layout can never
// produce the digest of an older one.
const digestVersion = "airlock-approval-request-v1"

// Digest returns the hex SHA-256 of a canonical encoding of r. Every field
// is tagged and length-prefixed, so no two different requests encode alike
// (Tool "ab" + Code "c" differs from Tool "a" + Code "bc"); domains are
// sorted because their order does not change what the sandbox may reach.
func (r Request) Digest() string {
	h := sha256.New()
	writeString(h, 0, digestVersion)
	writeString(h, 1, r.Tool)
	writeString(h, 2, r.Code)
	writeInt(h, 3, int64(r.Limits.TimeoutS))
	writeInt(h, 4, int64(r.Limits.MemoryMB))
	writeInt(h, 5, int64(r.Limits.CPUMillis))
	writeInt(h, 6, int64(r.Limits.Pids))
	writeInt(h, 7, r.Limits.MaxOutputBytes)
	writeString(h, 8, r.Network)
	domains := slices.Clone(r.AllowDomains)
	sort.Strings(domains)
	writeInt(h, 9, int64(len(domains)))
	for _, d := range domains {
		writeString(h, 10, d)
	}
	writeString(h, 11, r.Session)
	writeString(h, 12, r.Client)
	// Written only when present, so a request without secrets keeps the
	// digest it always had; the tags keep the two layouts apart.
	if len(r.Secrets) > 0 {
		secrets := slices.Clone(r.Secrets)
		sort.Strings(secrets)
		writeInt(h, 13, int64(len(secrets)))
		for _, s := range secrets {
			writeString(h, 14, s)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeString writes tag, length, bytes: the length prefix is what makes the
// encoding unambiguous.
func writeString(h hash.Hash, tag byte, s string) {
	var hdr [9]byte
	hdr[0] = tag
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(s)))
	h.Write(hdr[:])
	h.Write([]byte(s))
}

// writeInt writes tag and a fixed-width value.
func writeInt(h hash.Hash, tag byte, v int64) {
	var b [9]byte
	b[0] = tag
	binary.BigEndian.PutUint64(b[1:], uint64(v))
	h.Write(b[:])
}

// Errors returned by Ledger.Decide and Pending.Wait; distinct so a channel
// can tell the human why the answer was not taken.
var (
	ErrUnknown        = errors.New("approval: unknown approval id")
	ErrExpired        = errors.New("approval: approval request expired")
	ErrAlreadyDecided = errors.New("approval: approval request already decided")
	ErrConsumed       = errors.New("approval: approval already used by a run")
	// ErrChanged is returned when a call presents an approval that was asked
	// for different arguments: the human approved something else.
	ErrChanged = errors.New("approval: the call's arguments differ from what was approved")
)

// Reasons a decision was not a human's answer.
const (
	// ReasonExpired: nobody answered in time.
	ReasonExpired = "expired"
	// ReasonCancelled: the caller gave up (cancelled the call, disconnected).
	ReasonCancelled = "cancelled"
	// ReasonChanged: a retry presented the approval with other arguments.
	ReasonChanged = "arguments changed"
)

// Decision is the outcome of one Pending.
type Decision struct {
	ID       string
	Digest   string
	Approved bool
	Approver string
	// Reason is set when the decision was not a human's: ReasonExpired,
	// ReasonCancelled or ReasonChanged.
	Reason string
	At     time.Time
}

// Pending is one request waiting for a human. Its exported fields never
// change after Open, so they may be read without locking.
type Pending struct {
	ID      string
	Request Request
	Digest  string
	Created time.Time
	Expires time.Time
	// Info is what a channel shows besides the request itself.
	Info Info

	ledger   *Ledger
	done     chan struct{} // closed once decision is set
	decision Decision      // guarded by ledger.mu, set once
	decided  bool          // guarded by ledger.mu
	consumed bool          // guarded by ledger.mu
	claimed  bool          // guarded by ledger.mu
}

// Info describes a pending request for the channel that shows it; it is not
// part of the digest.
type Info struct {
	// Channel is how the human is asked: ChannelElicitation or ChannelConsole.
	Channel string
	// Transport is how the client reached airlock (stdio, http, …).
	Transport string
	// Rule is the policy rule that asked for a human.
	Rule string
	// Grants are requested domains outside the operator's allow-list that
	// approving would grant for this call only.
	Grants []string
	// Rendered is the code as the human sees it.
	Rendered Rendered
	// RoundTrip is set when the question went back to the client as an
	// input request (the stateless protocol): the client's retry carrying
	// the answer is the one way to decide it. A request asked any other
	// way (elicitation/create, the console) can never be decided by a
	// retry, whoever presents its id.
	RoundTrip bool
}

// Ref is a short reference to an approval id for logs that the requester
// may read (a stdio client owns airlock's stderr): enough for an operator
// to match it on the console, never enough to name the request.
func Ref(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// Ledger holds the approvals in flight. The zero value is not usable; call
// NewLedger.
type Ledger struct {
	mu      sync.Mutex
	pending map[string]*Pending
	now     func() time.Time
	// retain is how long a finished entry is kept so that late or repeated
	// answers get ErrExpired or ErrAlreadyDecided instead of ErrUnknown.
	retain time.Duration
}

// NewLedger returns an empty ledger using the wall clock.
func NewLedger() *Ledger {
	return &Ledger{pending: map[string]*Pending{}, now: time.Now, retain: 10 * time.Minute}
}

// newID returns 128 random bits in hex: unguessable, so an approval link or
// console entry cannot be decided by someone who only saw another.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; if it does,
		// approvals are not safe to issue.
		panic(fmt.Sprintf("approval: reading random id: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// Open registers req as waiting for a decision for at most ttl. Each call
// gets its own Pending, even for identical requests: one approval lets one
// run through.
func (l *Ledger) Open(req Request, ttl time.Duration) *Pending {
	return l.OpenWith(req, ttl, Info{})
}

// OpenWith is Open with the information a channel shows.
func (l *Ledger) OpenWith(req Request, ttl time.Duration, info Info) *Pending {
	req.AllowDomains = slices.Clone(req.AllowDomains) // the caller may reuse its slice
	req.Secrets = slices.Clone(req.Secrets)
	info.Grants = slices.Clone(info.Grants)
	now := l.now()
	p := &Pending{
		ID:      newID(),
		Request: req,
		Digest:  req.Digest(),
		Created: now,
		Expires: now.Add(ttl),
		Info:    info,
		ledger:  l,
		done:    make(chan struct{}),
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(now)
	l.pending[p.ID] = p
	return p
}

// Decide records a human's answer for id at time at. It refuses an unknown
// id, an expired request and a second answer, so an answer can never be
// moved to another request or replayed.
func (l *Ledger) Decide(id string, approve bool, approver string, at time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(l.now())
	p, ok := l.pending[id]
	if !ok {
		return fmt.Errorf("deciding %q: %w", id, ErrUnknown)
	}
	if p.decided {
		switch p.decision.Reason {
		case ReasonExpired:
			return fmt.Errorf("deciding %s (expired at %s): %w", id, p.Expires.Format(time.RFC3339), ErrExpired)
		case "":
			return fmt.Errorf("deciding %s (decided by %q at %s): %w", id, p.decision.Approver, p.decision.At.Format(time.RFC3339), ErrAlreadyDecided)
		default:
			return fmt.Errorf("deciding %s (%s at %s): %w", id, p.decision.Reason, p.decision.At.Format(time.RFC3339), ErrAlreadyDecided)
		}
	}
	if !at.Before(p.Expires) {
		p.resolveLocked(Decision{Reason: ReasonExpired, At: p.Expires})
		return fmt.Errorf("deciding %s (expired at %s): %w", id, p.Expires.Format(time.RFC3339), ErrExpired)
	}
	p.resolveLocked(Decision{Approved: approve, Approver: approver, At: at})
	return nil
}

// Claim hands the pending request id to the call that presents it back
// (a multi round-trip retry), once. Only a request whose question went to
// this client as an input request can be claimed: a request of another
// client, or one waiting for the console or for an elicitation/create
// answer, reads as unknown, so a client can neither answer a question it
// was not asked nor use or spoil another's approval. A
// second claim gets ErrConsumed. A claim whose digest differs from the
// request's is refused with ErrChanged and denies the request, since the
// human was shown other arguments.
func (l *Ledger) Claim(id, client, digest string) (*Pending, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(l.now())
	p, ok := l.pending[id]
	if !ok || p.Request.Client != client || p.Info.Channel != ChannelElicitation || !p.Info.RoundTrip {
		return nil, fmt.Errorf("approval %q: %w", id, ErrUnknown)
	}
	if p.claimed {
		if p.decided && p.decision.Reason == ReasonExpired {
			return nil, fmt.Errorf("approval %s: %w", id, ErrExpired)
		}
		return nil, fmt.Errorf("approval %s: %w", id, ErrConsumed)
	}
	p.claimed = true
	if p.Digest != digest {
		p.resolveLocked(Decision{Reason: ReasonChanged, At: l.now()})
		return nil, fmt.Errorf("approval %s: %w", id, ErrChanged)
	}
	return p, nil
}

// Adopt takes in a round-trip request another replica posted and this
// replica's retry claimed on the board, already claimed: the retry's
// answer decides it here.
func (l *Ledger) Adopt(v PendingView) *Pending {
	p := &Pending{
		ID:      v.ID,
		Request: Request{Tool: v.Tool, Client: v.Client, Session: v.Session, Network: v.Network, AllowDomains: v.AllowDomains, Secrets: v.Secrets},
		Digest:  v.Digest,
		Created: v.Created,
		Expires: v.Expires,
		Info:    Info{Channel: ChannelElicitation, RoundTrip: true, Transport: v.Transport, Rule: v.Rule, Grants: v.Grants},
		ledger:  l,
		done:    make(chan struct{}),
		claimed: true,
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(l.now())
	l.pending[p.ID] = p
	return p
}

// Abandon denies p as expired unless a call claimed it, and reports
// whether it did: the one place that decides who records a request whose
// caller never came back for its answer.
func (l *Ledger) Abandon(p *Pending) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.claimed {
		return false
	}
	p.claimed = true
	p.resolveLocked(Decision{Reason: ReasonExpired, At: p.Expires})
	return true
}

// Refuse denies p for reason (a channel failed), if nobody decided it yet.
func (l *Ledger) Refuse(p *Pending, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.resolveLocked(Decision{Reason: reason, At: l.now()})
}

// Cancel denies p because its caller gave up, if nobody decided it yet, so
// a console never offers a request whose call is gone.
func (l *Ledger) Cancel(p *Pending) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.resolveLocked(Decision{Reason: ReasonCancelled, At: l.now()})
}

// Get returns the request id whatever its state, or nil when unknown.
func (l *Ledger) Get(id string) *Pending {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending[id]
}

// Decided returns p's decision and whether there is one yet.
func (p *Pending) Decided() (Decision, bool) {
	p.ledger.mu.Lock()
	defer p.ledger.mu.Unlock()
	return p.decision, p.decided
}

// List returns the requests still waiting, oldest first, for one client
// identity, or for all clients when client is "".
func (l *Ledger) List(client string) []*Pending {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(l.now())
	var out []*Pending
	for _, p := range l.pending {
		if !p.decided && (client == "" || p.Request.Client == client) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Len returns the number of entries held, waiting or recently finished; it
// lets tests and metrics see that sweeping works.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// sweepLocked denies what has expired and forgets what finished long ago,
// so an unattended server does not grow without bound.
func (l *Ledger) sweepLocked(now time.Time) {
	for id, p := range l.pending {
		if !p.decided && !now.Before(p.Expires) {
			p.resolveLocked(Decision{Reason: ReasonExpired, At: p.Expires})
		}
		if p.decided && now.Sub(p.Expires) > l.retain {
			delete(l.pending, id)
		}
	}
}

// resolveLocked sets the decision once and wakes the waiters.
func (p *Pending) resolveLocked(d Decision) {
	if p.decided {
		return
	}
	d.ID, d.Digest = p.ID, p.Digest
	p.decision, p.decided = d, true
	close(p.done)
}

// Wait blocks until p is decided, expires (a denial with Reason
// ReasonExpired) or ctx is done. An approval is single-use: the first Wait
// that returns it consumes it, and later Waits get ErrConsumed, so one
// approval can never start two runs.
func (p *Pending) Wait(ctx context.Context) (Decision, error) {
	l := p.ledger
	timer := time.NewTimer(p.Expires.Sub(l.now()))
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		l.mu.Lock()
		p.resolveLocked(Decision{Reason: ReasonExpired, At: p.Expires})
		l.mu.Unlock()
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("waiting for approval %s: %w", p.ID, ctx.Err())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d := p.decision
	if d.Approved {
		if p.consumed {
			return Decision{}, fmt.Errorf("waiting for approval %s: %w", p.ID, ErrConsumed)
		}
		p.consumed = true
	}
	return d, nil
}
