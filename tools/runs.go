package tools

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// recentKeep is how many finished runs list_runs shows a client.
const recentKeep = 20

// RunInfo is one run as list_runs shows it to the client that owns it.
type RunInfo struct {
	RunID      string    `json:"run_id"`
	Tool       string    `json:"tool"`
	State      string    `json:"state" jsonschema:"waiting (for approval or a sandbox), running, finished"`
	Started    time.Time `json:"started"`
	DurationMS int64     `json:"duration_ms"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	Outcome    string    `json:"outcome,omitempty"`
	client     string
}

// Run states.
const (
	StateWaiting  = "waiting"
	StateRunning  = "running"
	StateFinished = "finished"
)

// runs is the registry of calls in flight and recently finished, per
// client. It is what makes a client's runs its own: list_runs and
// cancel_run see only the caller's, and a run id of another client reads as
// unknown. It also lets a shutdown wait for, then cancel, what is in flight.
type runs struct {
	mu       sync.Mutex
	live     map[string]*liveRun
	recent   map[string][]RunInfo // by client, newest last
	draining bool
	wg       sync.WaitGroup
}

type liveRun struct {
	info   RunInfo
	cancel context.CancelCauseFunc
}

// errShuttingDown cancels runs still going when the shutdown grace ends.
var errShuttingDown = fmt.Errorf("the server is shutting down")

// errCancelledByClient cancels a run through cancel_run.
var errCancelledByClient = fmt.Errorf("cancelled with cancel_run")

// begin registers a call; it fails once the server is draining.
func (r *runs) begin(id, tool, client string, cancel context.CancelCauseFunc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining {
		return false
	}
	if r.live == nil {
		r.live, r.recent = map[string]*liveRun{}, map[string][]RunInfo{}
	}
	r.live[id] = &liveRun{info: RunInfo{RunID: id, Tool: tool, State: StateWaiting, Started: time.Now().UTC(), client: client}, cancel: cancel}
	r.wg.Add(1)
	return true
}

func (r *runs) setState(id, state string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.live[id]; l != nil {
		l.info.State = state
	}
}

// end moves a call to the client's recent runs.
func (r *runs) end(id string, exit *int, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.live[id]
	if l == nil {
		return
	}
	delete(r.live, id)
	r.wg.Done()
	if outcome == "" {
		// A question sent back to the client: the call comes again.
		return
	}
	info := l.info
	info.State, info.ExitCode, info.Outcome = StateFinished, exit, outcome
	info.DurationMS = time.Since(info.Started).Milliseconds()
	rec := append(r.recent[info.client], info)
	if len(rec) > recentKeep {
		rec = rec[len(rec)-recentKeep:]
	}
	r.recent[info.client] = rec
}

// list returns client's runs: in flight first, then finished, newest first.
func (r *runs) list(client string) []RunInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []RunInfo{}
	for _, l := range r.live {
		if l.info.client == client {
			info := l.info
			info.DurationMS = time.Since(info.Started).Milliseconds()
			out = append(out, info)
		}
	}
	rec := r.recent[client]
	for i := len(rec) - 1; i >= 0; i-- {
		out = append(out, rec[i])
	}
	return out
}

// cancel cancels client's run id; another client's run reads as unknown.
func (r *runs) cancel(client, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.live[id]
	if l == nil || l.info.client != client {
		return false
	}
	l.cancel(errCancelledByClient)
	return true
}

// Drain refuses new calls, lets the ones in flight finish for up to grace,
// then cancels what is left (their sandboxes are killed) and waits up to
// another 15 s for them to clean up.
func (h *Handlers) Drain(grace time.Duration) {
	r := &h.runs
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	r.mu.Lock()
	n := len(r.live)
	for _, l := range r.live {
		l.cancel(errShuttingDown)
	}
	r.mu.Unlock()
	h.Log.Warn("shutdown grace over; cancelled runs still going", "count", n, "grace", grace)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		h.Log.Error("runs did not end after cancellation")
	}
}

// InFlight is the number of calls being served.
func (h *Handlers) InFlight() int {
	h.runs.mu.Lock()
	defer h.runs.mu.Unlock()
	return len(h.runs.live)
}

// ListRunsOutput is the structuredContent of list_runs.
type ListRunsOutput struct {
	Runs []RunInfo `json:"runs"`
}

// registerRunTools adds list_runs and cancel_run.
func (h *Handlers) registerRunTools(s *server.MCPServer) {
	s.AddTool(mcp.NewTool("list_runs",
		mcp.WithDescription("List this client's runs: those in flight (waiting or running) and the last 20 finished. Other clients' runs are never shown."),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[ListRunsOutput](),
		mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true),
		mcp.WithOpenWorldHintAnnotation(false),
	), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if m, ok := req.Params.Arguments.(map[string]any); ok && len(m) > 0 {
			return mcp.NewToolResultError("list_runs takes no arguments"), nil
		}
		out := ListRunsOutput{Runs: h.runs.list(CallerFrom(ctx).ID)}
		text := fmt.Sprintf("%d runs.\n", len(out.Runs))
		for _, r := range out.Runs {
			text += fmt.Sprintf("%s %s %s %d ms", r.RunID, r.Tool, r.State, r.DurationMS)
			if r.ExitCode != nil {
				text += fmt.Sprintf(" exit %d", *r.ExitCode)
			}
			text += "\n"
		}
		return structured(out, text), nil
	})
	s.AddTool(mcp.NewTool("cancel_run",
		mcp.WithDescription("Cancel one of this client's runs in flight, by the run_id its progress notifications and list_runs show. Its sandbox is killed."),
		mcp.WithString("run_id", mcp.Required(), mcp.Description("The run to cancel.")),
		mcp.WithSchemaAdditionalProperties(false),
		mcp.WithReadOnlyHintAnnotation(false),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true),
		mcp.WithOpenWorldHintAnnotation(false),
	), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		m, _ := req.Params.Arguments.(map[string]any)
		id, ok := m["run_id"].(string)
		if !ok || id == "" || len(m) != 1 {
			return mcp.NewToolResultError(`cancel_run takes {"run_id": string}`), nil
		}
		if !h.runs.cancel(CallerFrom(ctx).ID, id) {
			return mcp.NewToolResultError(fmt.Sprintf("No run %q in flight for this client (list_runs shows yours).", id)), nil
		}
		return mcp.NewToolResultText(fmt.Sprintf("Cancelled run %s; its sandbox is being killed.", id)), nil
	})
}
