package tools

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/runtime"
)

// Paused sessions: a session idle for sessions.pause_after, or asked with
// session_pause, is checkpointed to disk by its backend and holds no
// memory; its next call restores it. session_fork copies a session.

// pauses reports whether the backend pauses and forks sessions.
func (h *Handlers) pauses() bool {
	pc, ok := h.Manager.(runtime.PauseCapable)
	return ok && pc.PausesSessions()
}

// registerPauseTools adds session_pause and session_fork when the
// backend can.
func (h *Handlers) registerPauseTools(s *server.MCPServer) {
	if !h.pauses() {
		return
	}
	auto := "Idle sessions are paused on their own after " + h.Sessions.PauseAfter.String() + "."
	if h.Sessions.PauseAfter == 0 {
		auto = "Sessions are paused only when asked."
	}
	s.AddTool(mcp.NewTool("session_pause",
		mcp.WithDescription("Pause one of this client's sessions now: its sandbox is saved to disk and stopped, so it holds no memory, and its next call resumes it with its variables and files (a fraction of a second; the result says resumed_ms). "+auto+" Only sessions with network none pause."),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[SessionInfo](),
		mcp.WithReadOnlyHintAnnotation(false), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("session_pause", h.sessionPause))
	s.AddTool(mcp.NewTool("session_fork",
		mcp.WithDescription("Copy one of this client's sessions into a new session: the same Python variables and /workspace files, independent from then on (random generators are reseeded). It counts as one of this client's sessions. Only sessions with network none fork."),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[SessionInfo](),
		mcp.WithReadOnlyHintAnnotation(false), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(false), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("session_fork", h.sessionFork))
}

func (h *Handlers) sessionPause(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e, _, res := h.sessionArg(ctx, req, "session_pause")
	if res != nil {
		return res, nil
	}
	p, ok := e.s.(runtime.SessionPauser)
	if !ok {
		return mcp.NewToolResultError("This session cannot be paused on this backend."), nil
	}
	start := time.Now()
	if err := p.Pause(ctx); err != nil {
		return h.pauseError(e, "paused", err), nil
	}
	h.Log.Info("session paused", "session", e.id, "client", e.owner, "took", time.Since(start))
	info := h.sessionInfo(e)
	return structured(info, fmt.Sprintf("Session %s paused: its sandbox is saved to disk and holds no memory. Its next call resumes it.", e.id)), nil
}

func (h *Handlers) sessionFork(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e, _, res := h.sessionArg(ctx, req, "session_fork")
	if res != nil {
		return res, nil
	}
	f, ok := e.s.(runtime.SessionForker)
	if !ok {
		return mcp.NewToolResultError("This session cannot be forked on this backend."), nil
	}
	if res := h.sessionRoom(e.owner); res != nil {
		return res, nil
	}
	id := "s" + runtime.NewRunID()
	fork, err := f.Fork(ctx, runtime.SessionOptions{ID: id, Owner: e.owner, Idle: e.idle, Lifetime: h.Sessions.MaxLifetime})
	if err != nil {
		return h.pauseError(e, "forked", err), nil
	}
	now := time.Now()
	ne := &sessionEntry{id: id, owner: e.owner, s: fork, network: e.network, policy: e.policy, creds: e.creds, created: now, used: now, idle: e.idle}
	h.sessions.mu.Lock()
	h.sessions.m[id] = ne
	h.sessions.mu.Unlock()
	h.Log.Info("session forked", "session", e.id, "fork", id, "client", e.owner)
	info := h.sessionInfo(ne)
	return structured(info, fmt.Sprintf("Session %s is a copy of %s: the same variables and files, independent from now on. Pass \"session_id\": %q to use it.", id, e.id, id)), nil
}

// pauseError turns a refused pause or fork into a result.
func (h *Handlers) pauseError(e *sessionEntry, what string, err error) *mcp.CallToolResult {
	var ie *runtime.InfraError
	var co *runtime.CircuitOpenError
	switch {
	case errors.Is(err, runtime.ErrSessionBusy):
		return mcp.NewToolResultError(fmt.Sprintf("Session %s is busy with a call; it can be %s when the call has finished.", e.id, what))
	case errors.Is(err, runtime.ErrSessionClosed):
		h.sessions.remove(e.id)
		return mcp.NewToolResultError(fmt.Sprintf("Session %s has ended (%v); start another with session_create.", e.id, err))
	case errors.As(err, &co):
		return circuitResult(co)
	case errors.As(err, &ie):
		h.Log.Error("session "+what+" failed", "session", e.id, "op", ie.Op, "err", ie.Err)
		return infraResult(ie.Op)
	}
	return mcp.NewToolResultError(fmt.Sprintf("Session %s was not %s: %v", e.id, what, err))
}

// pauseIdle pauses, in the background, sessions idle for
// sessions.pause_after that are not paused yet.
func (h *Handlers) pauseIdle(now time.Time) {
	if h.Sessions.PauseAfter <= 0 || !h.pauses() {
		return
	}
	h.sessions.mu.Lock()
	defer h.sessions.mu.Unlock()
	for _, e := range h.sessions.m {
		p, ok := e.s.(runtime.SessionPauser)
		if !ok || e.busy > 0 || e.pausing || e.noPause || now.Sub(e.used) < h.Sessions.PauseAfter || e.paused {
			continue
		}
		e.pausing = true
		go func() {
			err := p.Pause(context.Background())
			h.sessions.mu.Lock()
			defer h.sessions.mu.Unlock()
			e.pausing = false
			switch {
			case err == nil:
				// Until its next call: useSession clears it.
				e.paused = true
				h.Log.Info("idle session paused", "session", e.id)
			case errors.Is(err, runtime.ErrSessionBusy):
			default:
				// Never retried: a networked session, or one whose
				// checkpoint failed, keeps its sandbox.
				e.noPause = true
				h.Log.Warn("idle session not paused", "session", e.id, "err", err)
			}
		}()
	}
}
