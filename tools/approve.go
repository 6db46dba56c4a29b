package tools

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
)

// approvalInputID keys the approval question in a multi round-trip request.
const approvalInputID = "airlock_approval"

// ruleDomainGrant names the reason a call needed a human although the
// policy would have let it through: it asked for a domain only a human may
// grant.
const ruleDomainGrant = "domain grant"

// approve runs the approval gate. It returns nil when the run may start;
// otherwise the call's result: a denial (recorded), or a request for the
// client to ask its user (recorded once the answer or the expiry comes).
//
// Whatever the call's arguments or _meta say about approval is ignored:
// only the gate's own ledger, answered by a human, lets a run through.
func (c *call) approve(ctx context.Context, req mcp.CallToolRequest, areq approval.Request, grants []string) *mcp.CallToolResult {
	g := c.h.Gate
	if g == nil {
		c.rec.Decision, c.rec.Rule = approval.DecisionAuto, approval.RuleModeOff
		return nil
	}
	if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
		return c.resume(ctx, req, areq)
	}
	needsHuman, rule := g.Policy.Decide(areq)
	if len(grants) > 0 {
		needsHuman, rule = true, ruleDomainGrant
	}
	c.rec.Rule = rule
	if !needsHuman {
		c.rec.Decision = approval.DecisionAuto
		return nil
	}
	info := approval.Info{Transport: c.caller.Transport, Rule: rule, Grants: grants, Rendered: approval.Render(areq.Code)}
	canElicit, modern := clientElicitation(ctx)
	switch {
	case canElicit && modern:
		return c.askRoundTrip(ctx, areq, info)
	case canElicit:
		return c.askElicitation(ctx, areq, info)
	case g.ConsoleOn():
		return c.askConsole(ctx, areq, info)
	default:
		c.rec.Decision = approval.DecisionNoChannel
		return c.fail(approval.OutcomeNotApproved, mcp.NewToolResultError(fmt.Sprintf(
			"Not run: this call needs a human's approval (rule %q) and there is no way to ask one: this client did not declare the MCP elicitation capability, and airlock's approval console is not serving. "+
				"Use a client that supports elicitation, or have the operator set approval.console.listen and approve calls there or with `airlock approvals`.", rule)))
	}
}

// clientElicitation reports whether the caller's client can show its user
// an elicitation, and whether it speaks the stateless protocol (2026-07-28
// and later), where the question goes back as an input request and the
// client retries the call with the answer.
func clientElicitation(ctx context.Context) (can, modern bool) {
	caps, modern := clientCapabilities(ctx)
	if !modern {
		// An old-protocol client is asked over its session, which must be
		// able to carry elicitation/create.
		if _, ok := server.ClientSessionFromContext(ctx).(server.SessionWithElicitation); !ok {
			return false, false
		}
	}
	return caps != nil && caps.Elicitation != nil, modern
}

// clientCapabilities are what the calling client declared: on each
// request for the 2026-07-28 protocol (modern), at initialize for older
// ones; nil when neither is known.
func clientCapabilities(ctx context.Context) (caps *mcp.ClientCapabilities, modern bool) {
	if info := server.RequestProtocolInfoFromContext(ctx); info != nil && info.Modern {
		return info.ClientCapabilities, true
	}
	if ci, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		c := ci.GetClientCapabilities()
		return &c, false
	}
	return nil, false
}

// askRoundTrip opens a pending request and hands the question to the
// client; the retry carrying the answer comes back through resume. If no
// retry comes before the request expires, the expiry is recorded then.
func (c *call) askRoundTrip(ctx context.Context, areq approval.Request, info approval.Info) *mcp.CallToolResult {
	g := c.h.Gate
	info.Channel, info.RoundTrip = approval.ChannelElicitation, true
	p := g.Open(areq, info)
	rec := c.rec
	rec.Channel, rec.ApprovalID, rec.Decision, rec.Outcome = approval.ChannelElicitation, p.ID, approval.DecisionExpired, approval.OutcomeNotApproved
	rec.Error = "Not run: the client never came back with the user's answer before the request expired."
	c.h.deferRecord(p, rec)
	c.written = true // recorded by the retry, or by the expiry
	c.h.Log.Info("asking the client's user for approval", "approval", p.ID, "tool", c.tool, "client", c.caller.ID, "protocol", "input request")
	return server.NewInputRequestBuilder(p.ID).Elicit(approvalInputID, elicitParams(ctx, p)).ToolResult()
}

// resume handles the retry of a call that asked for input: the request
// state names the pending request, which must belong to this client, be
// unclaimed and have been asked for exactly these arguments.
func (c *call) resume(ctx context.Context, req mcp.CallToolRequest, areq approval.Request) *mcp.CallToolResult {
	g := c.h.Gate
	c.rec.Channel, c.rec.ApprovalID = approval.ChannelElicitation, req.Params.RequestState
	p, err := g.Claim(req.Params.RequestState, c.caller.ID, areq.Digest())
	if err != nil {
		c.rec.Decision = approval.DecisionDenied
		if errors.Is(err, approval.ErrExpired) {
			c.rec.Decision = approval.DecisionExpired
		}
		c.h.Log.Warn("approval retry refused", "approval", req.Params.RequestState, "client", c.caller.ID, "err", err)
		return c.fail(approval.OutcomeNotApproved, mcp.NewToolResultError(approval.Explain(approval.Decision{}, err)))
	}
	c.h.cancelDeferred(p.ID)
	answer := server.ElicitationResponse(req.Params.InputResponses, approvalInputID)
	var derr error
	if answer == nil {
		g.Ledger().Refuse(p, "no answer in the retry")
	} else {
		derr = g.Ledger().Decide(p.ID, accepted(answer), "elicitation:"+c.caller.ID, time.Now())
	}
	return c.settle(ctx, p, derr)
}

// askElicitation asks the client's user over a session that predates the
// stateless protocol, and waits for the answer until the request expires.
func (c *call) askElicitation(ctx context.Context, areq approval.Request, info approval.Info) *mcp.CallToolResult {
	g := c.h.Gate
	info.Channel = approval.ChannelElicitation
	p := g.Open(areq, info)
	c.rec.Channel = approval.ChannelElicitation
	c.h.Log.Info("asking the client's user for approval", "approval_ref", approval.Ref(p.ID), "tool", c.tool, "client", c.caller.ID, "protocol", "elicitation/create")
	ectx, cancel := context.WithDeadline(ctx, p.Expires)
	defer cancel()
	defer c.h.tasks.asking(taskFrom(ctx))()
	res, err := c.h.server.RequestElicitation(ectx, mcp.ElicitationRequest{
		Request: mcp.Request{Method: string(mcp.MethodElicitationCreate)},
		Params:  elicitParams(ctx, p),
	})
	var derr error
	switch {
	case err == nil:
		derr = g.Ledger().Decide(p.ID, accepted(res), "elicitation:"+c.caller.ID, time.Now())
	case ctx.Err() != nil:
		g.Ledger().Cancel(p)
	case ectx.Err() != nil:
		// Expired: Wait reports it.
	default:
		c.h.Log.Warn("elicitation failed", "approval_ref", approval.Ref(p.ID), "err", err)
		g.Ledger().Refuse(p, "the client could not ask its user: "+err.Error())
	}
	return c.settle(ctx, p, derr)
}

// askConsole waits for an approver on the web console or the CLI.
func (c *call) askConsole(ctx context.Context, areq approval.Request, info approval.Info) *mcp.CallToolResult {
	info.Channel = approval.ChannelConsole
	p := c.h.Gate.Open(areq, info)
	c.rec.Channel, c.console = approval.ChannelConsole, true
	// Only a reference: a stdio client reads this log, and the console's
	// approver, not the client, decides.
	c.h.Log.Info("waiting for approval on the console", "approval_ref", approval.Ref(p.ID), "tool", c.tool, "client", c.caller.ID, "expires", p.Expires)
	return c.settle(ctx, p, nil)
}

// settle waits for p's decision and records it; nil means approved.
func (c *call) settle(ctx context.Context, p *approval.Pending, decideErr error) *mcp.CallToolResult {
	d, err := p.Wait(ctx)
	c.rec.ApprovalID = p.ID
	c.rec.WaitMS = time.Since(p.Created).Milliseconds()
	if err != nil {
		if ctx.Err() != nil {
			c.h.Gate.Ledger().Cancel(p)
			c.rec.Decision = approval.DecisionCancelled
			return c.fail(approval.OutcomeCancelled, mcp.NewToolResultError("Not run: the call was cancelled while it waited for approval."))
		}
		c.rec.Decision = approval.DecisionDenied
		return c.fail(approval.OutcomeNotApproved, mcp.NewToolResultError(approval.Explain(d, err)))
	}
	c.rec.Decision, c.rec.Approver = approval.DecisionName(d), d.Approver
	c.h.Log.Info("approval decided", "approval_ref", approval.Ref(p.ID), "decision", c.rec.Decision, "approver", d.Approver, "reason", d.Reason)
	if !d.Approved {
		return c.fail(approval.OutcomeNotApproved, mcp.NewToolResultError(approval.Explain(d, decideErr)))
	}
	return nil
}

// accepted reports whether an elicitation answer approves: the user
// accepted the form and ticked "approve". Anything else, including an
// accept with the box left empty, is a denial.
func accepted(r *mcp.ElicitationResult) bool {
	if r == nil || r.Action != mcp.ElicitationResponseActionAccept {
		return false
	}
	m, ok := r.Content.(map[string]any)
	if !ok {
		return false
	}
	v, ok := m["approve"].(bool)
	return ok && v
}

// elicitParams is the question a client shows its user.
func elicitParams(ctx context.Context, p *approval.Pending) mcp.ElicitationParams {
	params := mcp.ElicitationParams{
		Mode:    mcp.ElicitationModeForm,
		Message: approval.Describe(p),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{
					"type":        "boolean",
					"title":       "Run this code",
					"description": "Tick to run exactly the code shown, once. Leave it unticked, decline or cancel to refuse.",
					"default":     false,
				},
			},
			"required": []string{"approve"},
		},
	}
	if clientRendersApprovalApp(ctx) {
		params = withApprovalApp(params, p)
	}
	return params
}

// deferRecord arranges for rec to be written when p expires unclaimed.
func (h *Handlers) deferRecord(p *approval.Pending, rec approval.Record) {
	write := func() {
		if !h.Gate.Abandon(p) {
			return
		}
		rec.WaitMS = time.Since(p.Created).Milliseconds()
		if _, err := h.writeRecord(rec); err != nil {
			h.Log.Error("audit record not written", "approval", p.ID, "err", err)
		}
	}
	h.deferredMu.Lock()
	defer h.deferredMu.Unlock()
	if h.deferred == nil {
		h.deferred = map[string]deferredRecord{}
	}
	t := time.AfterFunc(time.Until(p.Expires)+500*time.Millisecond, func() {
		h.cancelDeferred(p.ID)
		write()
	})
	h.deferred[p.ID] = deferredRecord{timer: t, write: write}
}

// cancelDeferred forgets the deferred record of approval id.
func (h *Handlers) cancelDeferred(id string) {
	h.deferredMu.Lock()
	defer h.deferredMu.Unlock()
	if d, ok := h.deferred[id]; ok {
		d.timer.Stop()
		delete(h.deferred, id)
	}
}

type deferredRecord struct {
	timer *time.Timer
	write func()
}

// Close ends every session and writes the records of requests still
// waiting for a client's retry: at shutdown they will never be answered.
func (h *Handlers) Close() {
	h.closeSessions(true)
	h.writeDeferred()
}

// Detach is Close for a process that leaves its sandboxes for another to
// remove (its guardian): the records are written and sessions end, but
// their sandboxes are left as they are rather than half torn down by a
// process about to exit.
func (h *Handlers) Detach() {
	h.closeSessions(false)
	h.writeDeferred()
}

// writeDeferred writes the records of requests still waiting for a
// client's retry.
func (h *Handlers) writeDeferred() {
	h.deferredMu.Lock()
	pending := h.deferred
	h.deferred = nil
	h.deferredMu.Unlock()
	for _, d := range pending {
		d.timer.Stop()
		d.write()
	}
}
