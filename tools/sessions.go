package tools

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// reapEvery is how often ended sessions are looked for.
const reapEvery = 5 * time.Second

// sessions are the stateful sessions in being. Each belongs to the client
// that created it: for any other client its id does not exist.
type sessions struct {
	mu   sync.Mutex
	m    map[string]*sessionEntry
	stop chan struct{}
	once sync.Once
	// adoptMu makes takeovers one at a time: two calls for a session this
	// process does not hold yet must not both attach to it.
	adoptMu sync.Mutex
}

type sessionEntry struct {
	id, owner     string
	s             runtime.Session
	network       string
	policy        *egress.Policy
	creds         *egress.Credentials // its secrets and tripwires; nil: none
	created, used time.Time
	idle          time.Duration
	calls         int
	busy          int // calls in progress
	// pausing, paused and noPause are the idle pause's (pauseIdle).
	pausing, paused, noPause bool
}

// SessionInfo is a session as session_create and session_list show it.
type SessionInfo struct {
	SessionID    string    `json:"session_id"`
	Network      string    `json:"network"`
	AllowDomains []string  `json:"allow_domains"`
	Created      time.Time `json:"created"`
	LastUsed     time.Time `json:"last_used"`
	IdleTimeoutS int       `json:"idle_timeout_s" jsonschema:"The session ends this many seconds after its last call"`
	ExpiresAt    time.Time `json:"expires_at" jsonschema:"The session ends at this time at the latest"`
	Calls        int       `json:"calls"`
	Paused       bool      `json:"paused" jsonschema:"True while the session is paused: saved to disk, holding no memory; its next call resumes it"`
}

// SessionList is the structuredContent of session_list.
type SessionList struct {
	Sessions []SessionInfo `json:"sessions"`
}

func (h *Handlers) sessionInfo(e *sessionEntry) SessionInfo {
	info := SessionInfo{SessionID: e.id, Network: e.network, AllowDomains: []string{}, Created: e.created.UTC(), LastUsed: e.used.UTC(),
		IdleTimeoutS: int(e.idle / time.Second), ExpiresAt: e.created.Add(h.Sessions.MaxLifetime).UTC(), Calls: e.calls}
	if p, ok := e.s.(runtime.SessionPauser); ok {
		info.Paused = p.Paused()
	}
	if e.policy != nil {
		info.AllowDomains = e.policy.Domains()
	}
	return info
}

// get returns client's session id, or nil: another client's reads the same
// as one that does not exist.
func (r *sessions) get(id, client string) *sessionEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.m[id]
	if e == nil || e.owner != client {
		return nil
	}
	return e
}

// findSession returns client's session id: one this process holds, or,
// when the backend's sessions outlive the process that opened them, one
// it takes over from another airlock (one that was killed, say). A nil
// entry with a nil error means there is no such session for client.
func (h *Handlers) findSession(ctx context.Context, id, client string) (*sessionEntry, error) {
	if e := h.sessions.get(id, client); e != nil {
		return e, nil
	}
	sa, ok := h.Manager.(runtime.SessionAdopter)
	if !ok {
		return nil, nil
	}
	h.sessions.adoptMu.Lock()
	defer h.sessions.adoptMu.Unlock()
	if e := h.sessions.get(id, client); e != nil {
		return e, nil
	}
	sess, rec, err := sa.AdoptSession(ctx, id, client)
	switch {
	case errors.Is(err, runtime.ErrNoSession):
		return nil, nil
	case err != nil:
		h.Log.Warn("session takeover failed", "session", id, "err", err)
		return nil, fmt.Errorf("session %s could not be taken over from the airlock that served it: %w", id, err)
	}
	used := rec.LastUsed
	if used.IsZero() {
		used = time.Now()
	}
	e := &sessionEntry{id: id, owner: rec.Owner, s: sess, network: config.NetworkNone, created: rec.Created, used: used, idle: rec.Idle, calls: rec.Calls}
	if rec.Egress != nil {
		e.network, e.policy = config.NetworkAllowlist, rec.Egress
	}
	h.sessions.mu.Lock()
	h.sessions.m[id] = e
	h.sessions.mu.Unlock()
	h.Log.Info("session taken over", "session", id, "client", client, "calls_before", rec.Calls)
	return e, nil
}

// SessionsActive is how many sessions are open now.
func (h *Handlers) SessionsActive() int {
	h.sessions.mu.Lock()
	defer h.sessions.mu.Unlock()
	return len(h.sessions.m)
}

// remove forgets id and closes its session.
func (r *sessions) remove(id string) {
	r.mu.Lock()
	e := r.m[id]
	delete(r.m, id)
	r.mu.Unlock()
	if e != nil {
		go e.s.Close()
	}
}

// reap ends sessions idle or old past their time, until stopped.
func (h *Handlers) reap() {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-h.sessions.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		var done []string
		h.sessions.mu.Lock()
		for id, e := range h.sessions.m {
			// A session past its lifetime ends even mid-call: Close waits
			// for the call, which its own timeout bounds.
			if (e.busy == 0 && now.Sub(e.used) > e.idle) || now.Sub(e.created) > h.Sessions.MaxLifetime || e.s.Lost() {
				done = append(done, id)
			}
		}
		h.sessions.mu.Unlock()
		h.pauseIdle(now)
		for _, id := range done {
			h.Log.Info("session ended", "session", id, "why", "idle timeout, max lifetime or lost")
			h.sessions.remove(id)
		}
	}
}

// closeSessions ends every session (shutdown), destroying their
// sandboxes when destroy is set, except those the backend hands to
// another airlock.
func (h *Handlers) closeSessions(destroy bool) {
	h.sessions.once.Do(func() {
		if h.sessions.stop != nil {
			close(h.sessions.stop)
		}
	})
	h.sessions.mu.Lock()
	ids := make([]string, 0, len(h.sessions.m))
	for id := range h.sessions.m {
		ids = append(ids, id)
	}
	h.sessions.mu.Unlock()
	for _, id := range ids {
		h.sessions.mu.Lock()
		e := h.sessions.m[id]
		delete(h.sessions.m, id)
		h.sessions.mu.Unlock()
		if e == nil || !destroy {
			continue
		}
		// A session another airlock can serve is handed on, not ended: a
		// rolling update keeps it.
		if r, ok := e.s.(runtime.SessionReleaser); ok {
			r.Release()
		} else {
			e.s.Close()
		}
	}
}

func (h *Handlers) sessionsEnabled() bool {
	_, ok := h.Manager.(runtime.SessionManager)
	return ok && h.Sessions.Max > 0
}

// registerSessionTools adds session_create, session_close, session_list
// and the file tools, when the runtime can keep sessions.
func (h *Handlers) registerSessionTools(s *server.MCPServer) {
	if !h.sessionsEnabled() {
		return
	}
	h.sessions.m = map[string]*sessionEntry{}
	h.sessions.stop = make(chan struct{})
	go h.reap()
	opts := []mcp.ToolOption{
		mcp.WithDescription(fmt.Sprintf(`Start a stateful session: one sandbox kept between calls, like a notebook. Pass its session_id to run_python and run_shell: Python variables, imports and definitions persist between calls, and files in /workspace persist for Python and shell alike. Use write_file, read_file and list_files to move files in and out. The session ends after %s without a call (timeout_idle_s may ask for less), %s after it began at the latest, or with session_close. Every call is still limited and isolated as a one-shot call is.`,
			h.Sessions.IdleTimeout, h.Sessions.MaxLifetime)),
		mcp.WithInteger("timeout_idle_s", mcp.Description(fmt.Sprintf("End the session after this many seconds without a call (at most %d).", int(h.Sessions.IdleTimeout/time.Second))),
			mcp.Min(1), mcp.Max(h.Sessions.IdleTimeout.Seconds())),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[SessionInfo](),
		mcp.WithReadOnlyHintAnnotation(false), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(false), mcp.WithOpenWorldHintAnnotation(h.Egress != nil),
	}
	if h.Egress != nil {
		opts = append(opts,
			mcp.WithString("network", mcp.Enum(config.NetworkNone, config.NetworkAllowlist), mcp.Description("The session's network for its whole life: none, or allowlist (the operator's domains, through the egress proxy).")),
			mcp.WithArray("allow_domains", mcp.WithStringItems(), mcp.Description("With network allowlist: the domains the session needs, a subset of the operator's list.")))
		if names := h.Secrets.Names(); len(names) > 0 {
			opts = append(opts, mcp.WithArray("secrets", mcp.WithStringEnumItems(names), mcp.Description(h.secretsDescription()+" Given for the session's life.")))
		}
	}
	s.AddTool(mcp.NewTool("session_create", opts...), h.safe("session_create", h.sessionCreate))
	s.AddTool(mcp.NewTool("session_close",
		mcp.WithDescription("End one of this client's sessions now; its sandbox and files are destroyed."),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithSchemaAdditionalProperties(false),
		mcp.WithReadOnlyHintAnnotation(false), mcp.WithDestructiveHintAnnotation(true),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("session_close", h.sessionClose))
	s.AddTool(mcp.NewTool("session_list",
		mcp.WithDescription("List this client's sessions. Other clients' sessions are never shown."),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[SessionList](),
		mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("session_list", h.sessionList))
	h.registerPauseTools(s)
	h.registerFileTools(s)
}

// safe keeps a panic in a handler from reaching the transport.
func (h *Handlers) safe(name string, f server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		defer func() {
			if p := recover(); p != nil {
				h.Log.Error("tool handler panicked", "tool", name, "panic", p)
				res, err = infraResult("internal error"), nil
			}
		}()
		return f(ctx, req)
	}
}

func (h *Handlers) sessionCreate(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	m, _ := req.Params.Arguments.(map[string]any)
	if req.Params.Arguments != nil && m == nil {
		return mcp.NewToolResultError("session_create takes an object: {\"network\"?, \"allow_domains\"?, \"secrets\"?, \"timeout_idle_s\"?}"), nil
	}
	var args RunArgs
	idle := h.Sessions.IdleTimeout
	for k, v := range m {
		switch k {
		case "network":
			mode, ok := v.(string)
			if !ok || (mode != config.NetworkNone && mode != config.NetworkAllowlist) {
				return mcp.NewToolResultError(fmt.Sprintf("argument \"network\" must be \"none\" or \"allowlist\", got %s", describe(v))), nil
			}
			args.Network = mode
		case "allow_domains":
			list, ok := v.([]any)
			if !ok {
				return mcp.NewToolResultError("argument \"allow_domains\" must be an array of domain names"), nil
			}
			args.AllowDomains = []string{}
			for _, d := range list {
				name, ok := d.(string)
				if !ok || name == "" {
					return mcp.NewToolResultError("allow_domains must hold domain names"), nil
				}
				args.AllowDomains = append(args.AllowDomains, name)
			}
		case "secrets":
			names, err := parseSecretNames(v)
			if err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			args.Secrets = names
		case "timeout_idle_s":
			f, ok := v.(float64)
			if !ok || f != math.Trunc(f) || f < 1 || time.Duration(f)*time.Second > h.Sessions.IdleTimeout {
				return mcp.NewToolResultError(fmt.Sprintf("argument \"timeout_idle_s\" must be a whole number of seconds from 1 to %d (sessions.idle_timeout)", int(h.Sessions.IdleTimeout/time.Second))), nil
			}
			idle = time.Duration(f) * time.Second
		default:
			return mcp.NewToolResultError(fmt.Sprintf("unknown argument %q: session_create takes {\"network\"?, \"allow_domains\"?, \"secrets\"?, \"timeout_idle_s\"?}", k)), nil
		}
	}
	pol, grants, err := h.EgressFor(args)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	pol, creds, err := h.credentialsFor(args.Secrets, pol)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	var env, home map[string]string
	if creds != nil {
		env, home = creds.Env, creds.Files
	}
	if len(grants) > 0 {
		return mcp.NewToolResultError(fmt.Sprintf("a session cannot be granted domains outside the operator's list (%s): ask for them in a one-shot call", strings.Join(grants, ", "))), nil
	}
	caller := CallerFrom(ctx)
	if res := h.sessionRoom(caller.ID); res != nil {
		return res, nil
	}
	id := "s" + runtime.NewRunID()
	sm := h.Manager.(runtime.SessionManager)
	sess, err := sm.OpenSession(ctx, runtime.SessionOptions{ID: id, Limits: h.Limits.RunLimits(0), Egress: pol,
		Owner: caller.ID, Idle: idle, Lifetime: h.Sessions.MaxLifetime, Env: env, HomeFiles: home})
	if err != nil {
		var ie *runtime.InfraError
		var co *runtime.CircuitOpenError
		switch {
		case errors.As(err, &co):
			return circuitResult(co), nil
		case errors.As(err, &ie):
			h.Log.Error("session start failed", "op", ie.Op, "err", ie.Err)
			return infraResult(ie.Op), nil
		}
		return mcp.NewToolResultError("The session could not start: " + err.Error()), nil
	}
	now := time.Now()
	e := &sessionEntry{id: id, owner: caller.ID, s: sess, network: config.NetworkNone, policy: pol, creds: creds, created: now, used: now, idle: idle}
	if pol != nil {
		e.network = config.NetworkAllowlist
	}
	h.sessions.mu.Lock()
	h.sessions.m[id] = e
	h.sessions.mu.Unlock()
	h.Log.Info("session started", "session", id, "client", caller.ID, "network", e.network, "idle", idle)
	info := h.sessionInfo(e)
	return structured(info, fmt.Sprintf("Session %s started (network %s). Pass \"session_id\": %q to run_python, run_shell and the file tools. It ends after %d s without a call, at %s at the latest, or with session_close.",
		id, e.network, id, info.IdleTimeoutS, info.ExpiresAt.Format(time.RFC3339))), nil
}

// sessionRoom refuses a new session past sessions.per_client for client
// or sessions.max in all.
func (h *Handlers) sessionRoom(client string) *mcp.CallToolResult {
	h.sessions.mu.Lock()
	mine, all := 0, len(h.sessions.m)
	for _, e := range h.sessions.m {
		if e.owner == client {
			mine++
		}
	}
	h.sessions.mu.Unlock()
	switch {
	case mine >= h.Sessions.PerClient:
		return mcp.NewToolResultError(fmt.Sprintf("This client has %d sessions open (sessions.per_client); close one with session_close first.", mine))
	case all >= h.Sessions.Max:
		return mcp.NewToolResultError(fmt.Sprintf("The server holds its maximum of %d sessions (sessions.max); retry later or use one-shot calls.", all))
	}
	return nil
}

func (h *Handlers) sessionArg(ctx context.Context, req mcp.CallToolRequest, tool string, extra ...string) (*sessionEntry, map[string]any, *mcp.CallToolResult) {
	m, _ := req.Params.Arguments.(map[string]any)
	allowed := map[string]bool{"session_id": true}
	for _, k := range extra {
		allowed[k] = true
	}
	for k := range m {
		if !allowed[k] {
			return nil, nil, mcp.NewToolResultError(fmt.Sprintf("unknown argument %q for %s", k, tool))
		}
	}
	id, err := parseSessionID(m["session_id"])
	if err != nil {
		return nil, nil, mcp.NewToolResultError(err.Error())
	}
	e, err := h.findSession(ctx, id, CallerFrom(ctx).ID)
	switch {
	case err != nil:
		return nil, nil, mcp.NewToolResultError(err.Error())
	case e == nil:
		return nil, nil, mcp.NewToolResultError(noSession(id))
	}
	return e, m, nil
}

func (h *Handlers) sessionClose(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e, _, res := h.sessionArg(ctx, req, "session_close")
	if res != nil {
		return res, nil
	}
	h.sessions.remove(e.id)
	h.Log.Info("session closed", "session", e.id, "client", e.owner)
	return mcp.NewToolResultText(fmt.Sprintf("Session %s closed; its sandbox and files are gone.", e.id)), nil
}

func (h *Handlers) sessionList(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if m, ok := req.Params.Arguments.(map[string]any); ok && len(m) > 0 {
		return mcp.NewToolResultError("session_list takes no arguments"), nil
	}
	caller := CallerFrom(ctx).ID
	// Paused sessions an earlier airlock left for this client are taken
	// over now, so the list shows them.
	if l, ok := h.Manager.(runtime.SessionLister); ok {
		for _, id := range l.LeftSessions(caller) {
			if _, err := h.findSession(ctx, id, caller); err != nil {
				h.Log.Warn("paused session not taken over", "session", id, "err", err)
			}
		}
	}
	out := SessionList{Sessions: []SessionInfo{}}
	h.sessions.mu.Lock()
	for _, e := range h.sessions.m {
		if e.owner == caller {
			out.Sessions = append(out.Sessions, h.sessionInfo(e))
		}
	}
	h.sessions.mu.Unlock()
	sort.Slice(out.Sessions, func(i, j int) bool { return out.Sessions[i].Created.Before(out.Sessions[j].Created) })
	text := fmt.Sprintf("%d sessions.\n", len(out.Sessions))
	for _, s := range out.Sessions {
		text += fmt.Sprintf("%s network=%s calls=%d last used %s\n", s.SessionID, s.Network, s.Calls, s.LastUsed.Format(time.RFC3339))
	}
	return structured(out, text), nil
}

// noSession says a session id is not the caller's: one that ended, one
// that never was and another client's read alike.
func noSession(id string) string {
	return fmt.Sprintf("No session %q for this client: it ended, or was never yours. session_list shows yours; session_create starts one.", id)
}

// useSession marks a call on e as begun; the returned function marks it
// done. A session is idle only between calls: one waiting for approval or
// running long is not reaped for idleness.
func (h *Handlers) useSession(e *sessionEntry) (done func()) {
	h.sessions.mu.Lock()
	e.busy++
	e.calls++
	e.paused = false
	h.sessions.mu.Unlock()
	return func() {
		h.sessions.mu.Lock()
		e.busy--
		e.used = time.Now()
		h.sessions.mu.Unlock()
	}
}
