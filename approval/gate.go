package approval

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Channels a human can be asked through.
const (
	// ChannelElicitation asks the user of the MCP client that made the call.
	ChannelElicitation = "elicitation"
	// ChannelConsole asks whoever holds an approver token of airlock's web
	// console (or its CLI, `airlock approvals`).
	ChannelConsole = "console"
)

// Decisions as the audit log and the console name them.
const (
	// DecisionAuto: the policy let the run through without a human.
	DecisionAuto = "auto"
	// DecisionApproved: a human approved it.
	DecisionApproved = "approved"
	// DecisionDenied: a human denied it, or the approval did not bind.
	DecisionDenied = "denied"
	// DecisionExpired: nobody answered within approval.timeout.
	DecisionExpired = "expired"
	// DecisionCancelled: the caller gave up while waiting.
	DecisionCancelled = "cancelled"
	// DecisionNoChannel: a human was needed and none could be asked.
	DecisionNoChannel = "no_channel"
	// DecisionNone: the call never reached the gate (invalid arguments).
	DecisionNone = "none"
)

// recentKeep is how many finished requests the console shows.
const recentKeep = 50

// Gate is the approval state of one airlock process: the policy, the
// ledger of requests in flight, and the results of recently decided ones
// for the console. It does no I/O and knows no transport: the tools layer
// asks through MCP elicitation, the console through HTTP.
type Gate struct {
	Policy Policy
	// Timeout is how long a request waits for a human before it is denied.
	Timeout time.Duration
	ledger  *Ledger

	mu      sync.Mutex
	console bool
	recent  []Finished // newest last
	// board shares console requests with the other replicas (board.go).
	board    Board
	boardLog *slog.Logger
}

// NewGate returns a gate with an empty ledger.
func NewGate(p Policy, timeout time.Duration) *Gate {
	return &Gate{Policy: p, Timeout: timeout, ledger: NewLedger()}
}

// Ledger returns the gate's ledger.
func (g *Gate) Ledger() *Ledger { return g.ledger }

// SetConsole records whether a console is serving, so the tools layer knows
// whether it can send a human there.
func (g *Gate) SetConsole(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.console = on
}

// ConsoleOn reports whether a console is serving.
func (g *Gate) ConsoleOn() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.console
}

// Open registers req as waiting for a human through info.Channel.
func (g *Gate) Open(req Request, info Info) *Pending {
	p := g.ledger.OpenWith(req, g.Timeout, info)
	g.post(p)
	return p
}

// Pending returns the requests waiting on the console, oldest first.
func (g *Gate) Pending() []*Pending {
	var out []*Pending
	for _, p := range g.ledger.List("") {
		if p.Info.Channel == ChannelConsole {
			out = append(out, p)
		}
	}
	return out
}

// DecideConsole records a console approver's answer. Only requests sent to
// the console can be decided there: a request shown to an MCP client's user
// is that user's to answer.
func (g *Gate) DecideConsole(id string, approve bool, approver string) error {
	p := g.ledger.Get(id)
	if p != nil && p.Info.Channel != ChannelConsole {
		return fmt.Errorf("deciding %q: %w", id, ErrUnknown)
	}
	if b, _ := g.boardOf(); b != nil {
		// The board, not this replica's ledger, says who answered first.
		return g.decideShared(b, p, id, approve, approver)
	}
	if p == nil {
		return fmt.Errorf("deciding %q: %w", id, ErrUnknown)
	}
	return g.ledger.Decide(id, approve, approver, g.ledger.now())
}

// Finished is a decided request and what came of it, as the console shows
// it after the decision.
type Finished struct {
	ID       string    `json:"id"`
	Tool     string    `json:"tool"`
	Client   string    `json:"client"`
	Decision string    `json:"decision"`
	Approver string    `json:"approver,omitempty"`
	Outcome  string    `json:"outcome"`
	ExitCode *int      `json:"exit_code,omitempty"`
	Stdout   string    `json:"stdout,omitempty"`
	Stderr   string    `json:"stderr,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// Finish records what came of a request that went to the console, so the
// approver sees the result of what they approved.
func (g *Gate) Finish(f Finished) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recent = append(g.recent, f)
	if len(g.recent) > recentKeep {
		g.recent = append([]Finished(nil), g.recent[len(g.recent)-recentKeep:]...)
	}
}

// Recent returns the finished console requests, newest first.
func (g *Gate) Recent() []Finished {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Finished, len(g.recent))
	for i, f := range g.recent {
		out[len(out)-1-i] = f
	}
	return out
}

// DecisionName maps a Decision to the name the audit log uses.
func DecisionName(d Decision) string {
	switch {
	case d.Approved:
		return DecisionApproved
	case d.Reason == ReasonExpired:
		return DecisionExpired
	case d.Reason == ReasonCancelled:
		return DecisionCancelled
	default:
		return DecisionDenied
	}
}

// Explain says, for the caller, why a request was not approved, and what
// to do next.
func Explain(d Decision, err error) string {
	switch {
	case errors.Is(err, ErrChanged) || d.Reason == ReasonChanged:
		return "Not run: the arguments differ from the ones the approval was asked for. Call again without requestState to ask for a new approval."
	case errors.Is(err, ErrConsumed):
		return "Not run: that approval was already used by a run; each approval lets exactly one run through. Call again to ask for a new one."
	case errors.Is(err, ErrUnknown):
		return "Not run: no approval request with that id is waiting for this client. Call again to ask for a new approval."
	case errors.Is(err, ErrExpired) || d.Reason == ReasonExpired:
		return "Not run: nobody approved the request before it expired (approval.timeout). Call again to ask again."
	case d.Reason == ReasonCancelled:
		return "Not run: the call was cancelled while it waited for approval."
	case err != nil:
		return fmt.Sprintf("Not run: approval failed: %v", err)
	case d.Approver != "":
		return fmt.Sprintf("Not run: %s denied the request.", d.Approver)
	default:
		return "Not run: the request was denied."
	}
}

// sortViews puts console requests oldest first.
func sortViews(v []PendingView) {
	sort.SliceStable(v, func(i, j int) bool { return v[i].Created.Before(v[j].Created) })
}
