package tools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// call is one tool call on its way through the handler: validation, the
// approval gate, the run, and the one audit record it leaves, written
// before the result is returned.
type call struct {
	h      *Handlers
	tool   string
	caller Caller
	rec    approval.Record
	// console is set when a console approver decided the call: they are
	// shown what came of it.
	console bool
	written bool
	// steps are the times of the call's steps since it began, logged at
	// debug level when it ends (the benchmark reads them).
	t0    time.Time
	steps []any
}

// mark notes that the call reached step.
func (c *call) mark(step string) {
	c.steps = append(c.steps, slog.Float64(step, runtime.Millis(time.Since(c.t0))))
}

func (h *Handlers) handler(name, codeKey string, lang runtime.Language) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		c := h.newCall(ctx, name)
		// The call ends when the client cancels it, its connection or
		// session goes, cancel_run names it, or the server shuts down.
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		defer bindLifetime(ctx, cancel)()
		if !h.runs.begin(c.rec.ID, name, c.caller.ID, cancel) {
			return c.fail(approval.OutcomeCancelled, mcp.NewToolResultError("Not run: the server is shutting down; retry in a moment.")), nil
		}
		defer func() { h.runs.end(c.rec.ID, c.rec.ExitCode, c.rec.Outcome) }()
		defer func() {
			// Nothing panics out of a handler: a panic is an infrastructure fault.
			if p := recover(); p != nil {
				h.Log.Error("tool handler panicked", "tool", name, "run", c.rec.ID, "panic", p, "stack", string(debug.Stack()))
				res, err = c.fail(approval.OutcomeInfra, infraResult("internal error")), nil
			}
		}()
		return c.serve(ctx, req, codeKey, lang), nil
	}
}

// Call runs a tool by name outside MCP, through exactly the path an MCP
// call takes (validation, approval, audit); `airlock run` uses it.
func (h *Handlers) Call(ctx context.Context, tool string, args map[string]any) *mcp.CallToolResult {
	var req mcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = tool, args
	switch tool {
	case "run_python":
		res, _ := h.handler(tool, "code", runtime.Python)(ctx, req)
		return res
	case "run_shell":
		res, _ := h.handler(tool, "command", runtime.Shell)(ctx, req)
		return res
	default:
		return mcp.NewToolResultError(fmt.Sprintf("unknown tool %q", tool))
	}
}

func (h *Handlers) newCall(ctx context.Context, tool string) *call {
	caller := CallerFrom(ctx)
	return &call{h: h, tool: tool, caller: caller, t0: time.Now(), rec: approval.Record{
		ID:           runtime.NewRunID(),
		Time:         time.Now().UTC(),
		Client:       caller.ID,
		Transport:    caller.Transport,
		Tool:         tool,
		CodeSHA256:   approval.CodeSHA256(""),
		EgressDenied: []string{},
	}}
}

func (c *call) serve(ctx context.Context, req mcp.CallToolRequest, codeKey string, lang runtime.Language) *mcp.CallToolResult {
	h := c.h
	// The record names the code even when the arguments around it are wrong.
	if m, ok := req.Params.Arguments.(map[string]any); ok {
		if code, ok := m[codeKey].(string); ok {
			c.noteCode(code)
		}
	}
	args, err := ParseRunArgs(c.tool, codeKey, req.Params.Arguments, ArgLimits{CodeBytes: h.Limits.CodeBytes, MaxTimeoutS: h.Limits.MaxTimeoutS})
	if err != nil {
		return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error()))
	}
	c.mark("args")
	var sess *sessionEntry
	if args.SessionID != "" {
		sess, err = h.findSession(ctx, args.SessionID, c.caller.ID)
		switch {
		case err != nil:
			return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error()))
		case sess == nil:
			return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(noSession(args.SessionID)))
		}
		c.rec.Session = sess.id
		defer h.useSession(sess)()
	}
	var pol *egress.Policy
	var grants []string
	if sess != nil {
		pol = sess.policy // chosen at session_create, for the session's life
	} else if pol, grants, err = h.EgressFor(args); err != nil {
		return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error()))
	}
	var creds *egress.Credentials
	if sess != nil {
		creds = sess.creds
	} else if pol, creds, err = h.credentialsFor(args.Secrets, pol); err != nil {
		return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error()))
	}
	limits := h.Limits.RunLimits(args.Timeout)
	areq := approval.Request{
		Tool:    c.tool,
		Code:    args.Code,
		Limits:  ApprovalLimits(limits),
		Network: approval.NetworkNone,
		Client:  c.caller.ID,
		Session: c.rec.Session,
	}
	if pol != nil {
		areq.Network, areq.AllowDomains = approval.NetworkAllowlist, pol.Domains()
	}
	if creds != nil {
		areq.Secrets = creds.Names
		c.rec.Secrets, c.rec.Tripwires = creds.Names, len(creds.Tripwires()) > 0
	}
	c.rec.Limits, c.rec.Network, c.rec.AllowDomains, c.rec.Granted = areq.Limits, areq.Network, areq.AllowDomains, grants

	if res := c.approve(ctx, req, areq, grants); res != nil {
		return res
	}
	c.mark("approved")
	if res := c.auditReady(); res != nil {
		return res
	}
	c.mark("audit_ready")
	if h.Quotas != nil {
		release, err := h.Quotas.Take(c.caller.ID)
		if err != nil {
			return c.fail(approval.OutcomeClientLimit, mcp.NewToolResultError("Not run: "+err.Error()))
		}
		defer release()
	}
	h.runs.setState(c.rec.ID, StateRunning)
	rreq := runtime.Request{RunID: c.rec.ID, Language: lang, Code: args.Code, Limits: limits, Egress: pol, Rich: h.richCaps()}
	if creds != nil && sess == nil {
		// A session's were given once, at session_create.
		rreq.Env, rreq.HomeFiles = creds.Env, creds.Files
	}
	var status func(string)
	if t := taskFrom(ctx); t != nil {
		status = func(text string) { h.tasks.note(t, text) }
	}
	prog := newProgress(ctx, h.server, req, c.rec.ID, h.progressInterval(), status)
	if prog != nil {
		rreq.Output = prog.Output
	}
	var out runtime.Result
	if sess != nil {
		out, err = sess.s.Run(ctx, rreq)
		if out.SessionLost || errors.Is(err, runtime.ErrSessionClosed) {
			h.Log.Info("session ended", "session", sess.id, "why", "its interpreter died or would not stop", "run", c.rec.ID)
			h.sessions.remove(sess.id)
		}
	} else {
		out, err = h.Manager.Run(ctx, rreq)
	}
	prog.Close()
	c.mark("ran")
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", err, context.Cause(ctx))
	}
	res := h.result(c.tool, out, err)
	if o, ok := res.StructuredContent.(RunOutput); ok && sess != nil {
		o.SessionID = sess.id
		res.StructuredContent = o
		if o.SessionEnded {
			res.Content[0] = mcp.NewTextContent(RenderText(o))
		}
	}
	c.noteRun(out, err, res)
	return c.finish(res)
}

// richCaps are the configured bounds of a run's rich results.
func (h *Handlers) richCaps() driver.RichCaps {
	r := h.Rich
	if r == (config.RichConfig{}) {
		return driver.DefaultRichCaps
	}
	return driver.RichCaps{
		DisplayBytes: r.DisplayKB << 10, MaxImages: r.MaxImages, ImageBytes: r.ImageKB << 10,
		MaxFiles: r.MaxFiles, EmbedBytes: r.EmbedKB << 10, EmbedTotalBytes: r.EmbedTotalKB << 10,
	}
}

// auditReady returns nil when the call can be recorded, else its refusal.
func (c *call) auditReady() *mcp.CallToolResult {
	if c.h.Audit == nil {
		return nil
	}
	if err := c.h.Audit.Check(); err != nil {
		c.h.Log.Error("audit log not writable; refusing the call", "call", c.rec.ID, "tool", c.tool, "err", err)
		return c.fail(approval.OutcomeAuditDisabled, mcp.NewToolResultError(fmt.Sprintf(
			"Not run: the audit log cannot be written (%v), and airlock runs no code it cannot record. The operator should fix audit.path (or its filesystem) on the server; no restart is needed.", err)))
	}
	return nil
}

// ApprovalLimits are the parts of a run's limits a human approves.
func ApprovalLimits(l runtime.Limits) approval.Limits {
	return approval.Limits{
		TimeoutS:       int(l.Timeout / time.Second),
		MemoryMB:       int(l.MemoryBytes >> 20),
		CPUMillis:      int(l.CPUs * 1000),
		Pids:           int(l.Pids),
		MaxOutputBytes: int64(l.StdoutBytes + l.StderrBytes),
	}
}

func (c *call) noteCode(code string) {
	c.rec.CodeSHA256 = approval.CodeSHA256(code)
	c.rec.CodeBytes = len(code)
	if c.h.AuditCode {
		c.rec.Code = code
	}
}

// noteRun fills the record from the run's result.
func (c *call) noteRun(out runtime.Result, err error, res *mcp.CallToolResult) {
	switch {
	case err == nil:
		c.rec.Outcome = approval.OutcomeRan
		code := out.ExitCode
		c.rec.ExitCode = &code
		c.rec.DurationMS = out.Duration.Milliseconds()
		c.rec.StdoutBytes, c.rec.StderrBytes = int64(len(out.Stdout)), int64(len(out.Stderr))
		c.rec.Truncated = out.Truncated()
		c.rec.LimitHit = out.Reason
		c.rec.LimitsHit = out.LimitsHit
		c.rec.Warm = out.Warm
		for _, d := range out.EgressDenied {
			c.rec.EgressDenied = append(c.rec.EgressDenied, fmt.Sprintf("%s (%s)", deniedWhere(d.Host, d.Port, d.Method, d.Path), d.Reason))
		}
		for _, a := range out.Attempts {
			c.rec.Attempts = append(c.rec.Attempts, fmt.Sprintf("%s %s x%d", a.Kind, a.Syscall, a.Count))
		}
	case errors.Is(err, runtime.ErrBusy), errors.Is(err, runtime.ErrSessionBusy):
		c.rec.Outcome, c.rec.Error = approval.OutcomeBusy, resultText(res)
	case errors.As(err, new(*runtime.CircuitOpenError)):
		c.rec.Outcome, c.rec.Error = approval.OutcomeCircuitOpen, resultText(res)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		c.rec.Outcome, c.rec.Error = approval.OutcomeCancelled, resultText(res)
	default:
		c.rec.Outcome, c.rec.Error = approval.OutcomeInfra, resultText(res)
	}
}

// fail ends a call that did not run: it records why and returns res.
func (c *call) fail(outcome string, res *mcp.CallToolResult) *mcp.CallToolResult {
	c.rec.Outcome = outcome
	c.rec.Error = resultText(res)
	return c.finish(res)
}

// finish writes the call's record, once, and shows a console approver what
// came of the call. A record that cannot be written is logged and said in
// the result: the run (if any) has happened, and hiding its output would not
// undo it.
func (c *call) finish(res *mcp.CallToolResult) *mcp.CallToolResult {
	if c.written {
		return res
	}
	c.written = true
	if c.rec.Decision == "" {
		c.rec.Decision = approval.DecisionNone
	}
	countCall(c.rec)
	c.mark("result")
	hash, err := c.h.writeRecord(c.rec)
	c.mark("recorded")
	if c.h.Log.Enabled(context.Background(), slog.LevelDebug) {
		c.h.Log.Debug("call steps", append([]any{"run", c.rec.ID, "tool", c.tool}, c.steps...)...)
	}
	if err != nil {
		c.h.Log.Error("audit record not written", "run", c.rec.ID, "err", err)
		res.Content = append(res.Content, mcp.NewTextContent(fmt.Sprintf("Warning: the audit record of this call could not be written (%v).", err)))
	}
	if hash != "" {
		// The client can keep it and later show this very record exists.
		switch o := res.StructuredContent.(type) {
		case RunOutput:
			o.AuditRecord = hash
			res.StructuredContent = o
		case WriteFileOutput:
			o.AuditRecord = hash
			res.StructuredContent = o
		}
	}
	if c.console && c.h.Gate != nil {
		f := approval.Finished{
			ID: c.rec.ApprovalID, Tool: c.tool, Client: c.caller.ID, Decision: c.rec.Decision,
			Approver: c.rec.Approver, Outcome: c.rec.Outcome, ExitCode: c.rec.ExitCode, Error: c.rec.Error, At: time.Now().UTC(),
		}
		if o, ok := res.StructuredContent.(RunOutput); ok {
			f.Stdout, f.Stderr = clip(o.Stdout, 4096), clip(o.Stderr, 4096)
		}
		c.h.Gate.Finish(f)
	}
	return res
}

// writeRecord writes rec and returns its line's hash ("" without a log).
func (h *Handlers) writeRecord(rec approval.Record) (string, error) {
	if h.Audit == nil {
		return "", nil
	}
	if !h.AuditCode {
		rec.Code = ""
	}
	return h.Audit.Write(rec)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n[…]"
}

// resultText is the text of a result, for records and tests.
func resultText(r *mcp.CallToolResult) string {
	if r == nil {
		return ""
	}
	s := ""
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}
