package tools_test

// Tests of the approval gate through mcp-go's own clients and server
// dispatch: the in-process client (both protocol eras) with an elicitation
// handler, raw stateless tools/call messages for the multi round-trip
// binding cases, and the console over HTTP. The runtime is a recording
// stand-in here; tests/e2e and approval_linux_test.go run real sandboxes.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
	"github.com/airlock-mcp/airlock/server"
	"github.com/airlock-mcp/airlock/tools"
)

// recorder stands in for the runtime: it counts runs and what they were.
type recorder struct {
	mu   sync.Mutex
	runs []runtime.Request
}

func (r *recorder) Run(_ context.Context, req runtime.Request) (runtime.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, req)
	return runtime.Result{RunID: req.RunID, Stdout: "ran: " + req.Code + "\n"}, nil
}
func (r *recorder) Close(context.Context) error { return nil }
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs)
}

type fixture struct {
	h     *tools.Handlers
	srv   *mcpserver.MCPServer
	rt    *recorder
	audit string
}

func newFixture(t *testing.T, mode string, timeout time.Duration) *fixture {
	t.Helper()
	pol, err := approval.ParsePolicy(mode, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	rt := &recorder{}
	h := &tools.Handlers{
		Manager: rt, Limits: config.Defaults().Limits, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Gate: approval.NewGate(pol, timeout), Audit: approval.NewAudit(path, 0), AuditCode: true,
	}
	t.Cleanup(h.Close)
	return &fixture{h: h, srv: server.New("test", h), rt: rt, audit: path}
}

// records reads the audit log, failing on anything but whole JSON lines.
func (f *fixture) records(t *testing.T) []approval.Record {
	t.Helper()
	data, err := os.ReadFile(f.audit)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []approval.Record
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var r struct {
			approval.Record
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %q is not a record: %v", sc.Text(), err)
		}
		if r.Kind == "" { // not the genesis line or a seal
			out = append(out, r.Record)
		}
	}
	return out
}

// answer is a scripted user behind an elicitation handler.
type answer struct {
	mu       sync.Mutex
	action   mcp.ElicitationResponseAction
	content  any
	block    bool // never answer: wait until the request is abandoned
	messages []string
}

func (a *answer) Elicit(ctx context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	a.mu.Lock()
	a.messages = append(a.messages, req.Params.Message)
	block, action, content := a.block, a.action, a.content
	a.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: action, Content: content}}, nil
}

func (a *answer) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.messages) == 0 {
		return ""
	}
	return a.messages[len(a.messages)-1]
}

func inProcess(t *testing.T, f *fixture, a *answer, version string) *client.Client {
	t.Helper()
	opts := []client.ClientOption{client.WithElicitationHandler(a)}
	if version != "" {
		opts = append(opts, client.WithProtocolVersion(version))
	}
	c, err := client.NewInProcessClientWithOptions(f.srv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	var init mcp.InitializeRequest
	init.Params.ClientInfo = mcp.Implementation{Name: "approval-test", Version: "0"}
	init.Params.ProtocolVersion = version
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func callPython(t *testing.T, c *client.Client, code string) *mcp.CallToolResult {
	t.Helper()
	var req mcp.CallToolRequest
	req.Params.Name = "run_python"
	req.Params.Arguments = map[string]any{"code": code}
	res, err := c.CallTool(t.Context(), req)
	if err != nil {
		t.Fatalf("CallTool: %v", err)
	}
	return res
}

func resText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Accept runs; decline, cancel and an unticked accept do not; in both
// protocol eras, and each call leaves one record saying so.
func TestElicitationAnswers(t *testing.T) {
	eras := []struct{ name, version string }{
		{"elicitation/create (2025-11-25)", mcp.ProtocolVersion20251125},
		{"input request round trip (2026-07-28)", mcp.LATEST_PROTOCOL_VERSION},
	}
	cases := []struct {
		name     string
		action   mcp.ElicitationResponseAction
		content  any
		runs     bool
		decision string
	}{
		{"accept", mcp.ElicitationResponseActionAccept, map[string]any{"approve": true}, true, approval.DecisionApproved},
		{"decline", mcp.ElicitationResponseActionDecline, nil, false, approval.DecisionDenied},
		{"cancel", mcp.ElicitationResponseActionCancel, nil, false, approval.DecisionDenied},
		{"accept unticked", mcp.ElicitationResponseActionAccept, map[string]any{"approve": false}, false, approval.DecisionDenied},
		{"accept empty", mcp.ElicitationResponseActionAccept, map[string]any{}, false, approval.DecisionDenied},
	}
	for _, era := range eras {
		for _, tc := range cases {
			t.Run(era.name+"/"+tc.name, func(t *testing.T) {
				f := newFixture(t, "always", 10*time.Second)
				a := &answer{action: tc.action, content: tc.content}
				c := inProcess(t, f, a, era.version)
				res := callPython(t, c, "print('approved-run')")
				if got := f.rt.count(); (got == 1) != tc.runs || got > 1 {
					t.Fatalf("runs = %d, want run=%v; result %q", got, tc.runs, resText(res))
				}
				if res.IsError == tc.runs {
					t.Errorf("isError = %v for %s: %q", res.IsError, tc.name, resText(res))
				}
				if !tc.runs && !strings.HasPrefix(resText(res), "Not run:") {
					t.Errorf("denial text = %q, want it to say the code did not run", resText(res))
				}
				if !strings.Contains(a.last(), "print('approved-run')") {
					t.Errorf("the user was not shown the code: %q", a.last())
				}
				recs := f.records(t)
				if len(recs) != 1 {
					t.Fatalf("%d audit records, want exactly 1: %+v", len(recs), recs)
				}
				r := recs[0]
				if r.Decision != tc.decision || r.Channel != approval.ChannelElicitation || r.ApprovalID == "" || (r.ExitCode != nil) != tc.runs {
					t.Errorf("record = %+v, want decision %s via elicitation", r, tc.decision)
				}
				if tc.runs && (r.Approver == "" || r.Outcome != approval.OutcomeRan) {
					t.Errorf("approved record lacks approver or outcome: %+v", r)
				}
			})
		}
	}
}

// The elicitation shows hidden characters for what they are.
func TestElicitationShowsHiddenCharacters(t *testing.T) {
	f := newFixture(t, "always", 10*time.Second)
	a := &answer{action: mcp.ElicitationResponseActionDecline}
	c := inProcess(t, f, a, mcp.ProtocolVersion20251125)
	code := "access = 'user' # \u202e } \u2066if admin\u2069 \u2066\nprint('safe')\r__import__('os').system('id')\n"
	callPython(t, c, code)
	msg := a.last()
	for _, want := range []string{"⟦U+202E RIGHT-TO-LEFT OVERRIDE⟧", "⟦U+2066 LEFT-TO-RIGHT ISOLATE⟧", "print('safe')⟦CR⟧__import__('os').system('id')", approval.WarnBidi, approval.WarnCR, "2 lines", "Network: none"} {
		if !strings.Contains(msg, want) {
			t.Errorf("elicitation message lacks %q:\n%s", want, msg)
		}
	}
	if strings.ContainsAny(msg, "\u202e\u2066\u2069\r") {
		t.Errorf("elicitation message still holds raw hidden characters: %q", msg)
	}
}

// Nobody answers: the call is denied when approval.timeout passes, in both eras.
func TestElicitationTimeoutDenies(t *testing.T) {
	t.Run("elicitation/create", func(t *testing.T) {
		f := newFixture(t, "always", 300*time.Millisecond)
		c := inProcess(t, f, &answer{block: true}, mcp.ProtocolVersion20251125)
		start := time.Now()
		res := callPython(t, c, "print(1)")
		if f.rt.count() != 0 || !res.IsError || !strings.Contains(resText(res), "expired") {
			t.Fatalf("runs=%d result %q; want an expiry denial", f.rt.count(), resText(res))
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("denial took %v", d)
		}
		if recs := f.records(t); len(recs) != 1 || recs[0].Decision != approval.DecisionExpired {
			t.Errorf("records = %+v, want one expired", recs)
		}
	})
	t.Run("round trip never retried", func(t *testing.T) {
		f := newFixture(t, "always", 200*time.Millisecond)
		res := raw(t, f, "c1", modernCall(t, map[string]any{"code": "print(1)"}, "", nil))
		if res.ResultType != mcp.ResultTypeInputRequired {
			t.Fatalf("first answer %+v, want input_required", res)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(f.records(t)) == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		recs := f.records(t)
		if len(recs) != 1 || recs[0].Decision != approval.DecisionExpired || recs[0].ApprovalID != res.RequestState {
			t.Fatalf("records = %+v, want one expired record for %s", recs, res.RequestState)
		}
		// The late answer is refused and recorded as its own call.
		late := raw(t, f, "c1", modernCall(t, map[string]any{"code": "print(1)"}, res.RequestState, accept()))
		if !late.IsError || !strings.Contains(resText(late), "expired") || f.rt.count() != 0 {
			t.Errorf("late retry: %q runs=%d; want refused as expired", resText(late), f.rt.count())
		}
	})
}

// modernCall builds a stateless (2026-07-28) tools/call for run_python.
func modernCall(t *testing.T, args map[string]any, state string, responses map[string]any) json.RawMessage {
	t.Helper()
	params := map[string]any{
		"name": "run_python", "arguments": args,
		"_meta": map[string]any{
			mcp.MetaKeyProtocolVersion:    mcp.LATEST_PROTOCOL_VERSION,
			mcp.MetaKeyClientCapabilities: map[string]any{"elicitation": map[string]any{}},
			mcp.MetaKeyClientInfo:         map[string]any{"name": "raw", "version": "0"},
		},
	}
	if state != "" {
		params["requestState"] = state
	}
	if responses != nil {
		params["inputResponses"] = responses
	}
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func accept() map[string]any {
	return map[string]any{"airlock_approval": map[string]any{"action": "accept", "content": map[string]any{"approve": true}}}
}

// raw sends one message through the server's own dispatch as client id.
func raw(t *testing.T, f *fixture, clientID string, msg json.RawMessage) *mcp.CallToolResult {
	t.Helper()
	ctx := tools.WithCaller(t.Context(), tools.Caller{ID: clientID, Transport: "test"})
	resp := f.srv.HandleMessage(ctx, msg)
	b, err := json.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	if env.Error != nil {
		t.Fatalf("JSON-RPC error %q for %s", env.Error.Message, msg)
	}
	res, err := mcp.ParseCallToolResult(&env.Result)
	if err != nil {
		t.Fatalf("parse %s: %v", env.Result, err)
	}
	return res
}

// An approval binds to the client, the exact arguments, and one run.
func TestRoundTripBinding(t *testing.T) {
	code := map[string]any{"code": "print('approved')"}
	ask := func(t *testing.T, f *fixture) string {
		t.Helper()
		res := raw(t, f, "alice", modernCall(t, code, "", nil))
		if res.ResultType != mcp.ResultTypeInputRequired || res.RequestState == "" {
			t.Fatalf("first answer %+v, want input_required with a state", res)
		}
		if _, ok := res.InputRequests["airlock_approval"]; !ok {
			t.Fatalf("input requests %v lack airlock_approval", res.InputRequests)
		}
		return res.RequestState
	}
	refused := func(t *testing.T, f *fixture, res *mcp.CallToolResult, want string) {
		t.Helper()
		if !res.IsError || !strings.Contains(resText(res), want) {
			t.Errorf("result %q (isError %v), want a refusal saying %q", resText(res), res.IsError, want)
		}
	}

	t.Run("approved retry runs once", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		state := ask(t, f)
		if res := raw(t, f, "alice", modernCall(t, code, state, accept())); res.IsError || f.rt.count() != 1 {
			t.Fatalf("approved retry: %q runs=%d", resText(res), f.rt.count())
		}
		// Reuse of the same approval for a second call.
		refused(t, f, raw(t, f, "alice", modernCall(t, code, state, accept())), "already used")
		if f.rt.count() != 1 {
			t.Errorf("one approval ran %d times", f.rt.count())
		}
		if n := len(f.records(t)); n != 2 {
			t.Errorf("%d records for two calls", n)
		}
	})
	t.Run("changed code", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		state := ask(t, f)
		refused(t, f, raw(t, f, "alice", modernCall(t, map[string]any{"code": "print('other')"}, state, accept())), "arguments differ")
		// The request the human saw is now spent: the original cannot use it either.
		refused(t, f, raw(t, f, "alice", modernCall(t, code, state, accept())), "already used")
		if f.rt.count() != 0 {
			t.Errorf("ran %d times", f.rt.count())
		}
	})
	t.Run("changed limits", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		state := ask(t, f)
		refused(t, f, raw(t, f, "alice", modernCall(t, map[string]any{"code": "print('approved')", "timeout_s": 300.0}, state, accept())), "arguments differ")
	})
	t.Run("another client", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		state := ask(t, f)
		refused(t, f, raw(t, f, "mallory", modernCall(t, code, state, accept())), "no approval request")
		// Mallory's attempt did not spoil Alice's approval.
		if res := raw(t, f, "alice", modernCall(t, code, state, accept())); res.IsError || f.rt.count() != 1 {
			t.Errorf("alice's retry after mallory's: %q runs=%d", resText(res), f.rt.count())
		}
	})
	t.Run("forged state", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		refused(t, f, raw(t, f, "alice", modernCall(t, code, "0123456789abcdef0123456789abcdef", accept())), "no approval request")
		if f.rt.count() != 0 {
			t.Errorf("forged state ran code")
		}
	})
	t.Run("decision after expiry", func(t *testing.T) {
		f := newFixture(t, "always", 150*time.Millisecond)
		state := ask(t, f)
		time.Sleep(250 * time.Millisecond)
		refused(t, f, raw(t, f, "alice", modernCall(t, code, state, accept())), "expired")
		if f.rt.count() != 0 {
			t.Errorf("expired approval ran code")
		}
	})
	t.Run("approved argument and _meta ignored", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		msg := modernCall(t, code, "", nil)
		var m map[string]any
		_ = json.Unmarshal(msg, &m)
		m["params"].(map[string]any)["_meta"].(map[string]any)["approved"] = true
		msg, _ = json.Marshal(m)
		if res := raw(t, f, "alice", msg); res.ResultType != mcp.ResultTypeInputRequired || f.rt.count() != 0 {
			t.Errorf("_meta.approved: %+v runs=%d, want a question for the human", res, f.rt.count())
		}
		res := raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)", "approved": true}, "", nil))
		if !res.IsError || !strings.Contains(resText(res), `unknown argument "approved"`) || f.rt.count() != 0 {
			t.Errorf("approved argument: %q runs=%d", resText(res), f.rt.count())
		}
	})
	t.Run("two identical calls need two approvals", func(t *testing.T) {
		f := newFixture(t, "always", 10*time.Second)
		s1, s2 := ask(t, f), ask(t, f)
		if s1 == s2 {
			t.Fatal("identical calls share one approval request")
		}
		raw(t, f, "alice", modernCall(t, code, s1, accept()))
		raw(t, f, "alice", modernCall(t, code, s2, map[string]any{"airlock_approval": map[string]any{"action": "decline"}}))
		if f.rt.count() != 1 {
			t.Errorf("runs = %d, want 1 (one approved, one declined)", f.rt.count())
		}
	})
}

// A client without elicitation and no console: denied with a way out.
func TestNoChannelDenies(t *testing.T) {
	f := newFixture(t, "always", 10*time.Second)
	c, err := client.NewInProcessClient(f.srv)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var init mcp.InitializeRequest
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatal(err)
	}
	res := callPython(t, c, "print(1)")
	if !res.IsError || f.rt.count() != 0 || !strings.Contains(resText(res), "approval.console.listen") {
		t.Errorf("result %q runs=%d; want a denial naming how to enable a channel", resText(res), f.rt.count())
	}
	if recs := f.records(t); len(recs) != 1 || recs[0].Decision != approval.DecisionNoChannel {
		t.Errorf("records = %+v", recs)
	}
}

// Rules: offline python is let through, networked calls ask.
func TestRulesAutoApprove(t *testing.T) {
	pol, err := approval.ParsePolicy("rules", []approval.RuleConfig{
		{Name: "offline python", Tool: "run_python", Network: "none", Action: "approve"},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, "always", 10*time.Second)
	f.h.Gate.Policy = pol
	op, _ := egress.ParsePolicy([]string{"pypi.org"}, nil, nil)
	f.h.Egress = &op
	res := raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)"}, "", nil))
	if res.IsError || f.rt.count() != 1 {
		t.Fatalf("offline python: %q runs=%d, want it auto-approved", resText(res), f.rt.count())
	}
	res = raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)", "network": "allowlist"}, "", nil))
	if res.ResultType != mcp.ResultTypeInputRequired {
		t.Fatalf("networked python: %+v, want a question", res)
	}
	recs := f.records(t)
	if len(recs) != 1 || recs[0].Decision != approval.DecisionAuto || recs[0].Rule != "offline python" {
		t.Errorf("records = %+v", recs)
	}
}

// A domain outside the operator's list but grantable makes the call ask,
// even where the rules approve, and the approver sees the domain.
func TestJustInTimeGrant(t *testing.T) {
	f := newFixture(t, "rules", 10*time.Second)
	pol, _ := approval.ParsePolicy("rules", []approval.RuleConfig{{Action: "approve"}})
	f.h.Gate.Policy = pol
	op, _ := egress.ParsePolicy([]string{"pypi.org"}, nil, nil)
	gr, _ := egress.ParsePolicy([]string{"*.example.org"}, nil, nil)
	f.h.Egress, f.h.Grantable = &op, &gr
	args := map[string]any{"code": "print(1)", "network": "allowlist", "allow_domains": []any{"pypi.org", "data.example.org"}}
	res := raw(t, f, "alice", modernCall(t, args, "", nil))
	if res.ResultType != mcp.ResultTypeInputRequired {
		t.Fatalf("grant request: %+v (%q), want a question", res, resText(res))
	}
	msg := res.InputRequests["airlock_approval"].Elicitation.Message
	if !strings.Contains(msg, "outside the operator's allow-list") || !strings.Contains(msg, "data.example.org") {
		t.Errorf("message does not show the domain request:\n%s", msg)
	}
	if r := raw(t, f, "alice", modernCall(t, args, res.RequestState, accept())); r.IsError || f.rt.count() != 1 {
		t.Fatalf("granted retry: %q", resText(r))
	}
	got := f.rt.runs[0].Egress.Domains()
	if strings.Join(got, ",") != "data.example.org,pypi.org" {
		t.Errorf("run's allow-list = %v, want the grant added", got)
	}
	if recs := f.records(t); len(recs) != 1 || strings.Join(recs[0].Granted, ",") != "data.example.org" {
		t.Errorf("record granted = %+v", recs)
	}
	// Outside both lists: an argument error that names what may be granted.
	bad := raw(t, f, "alice", modernCall(t, map[string]any{"code": "x", "network": "allowlist", "allow_domains": []any{"evil.com"}}, "", nil))
	if !bad.IsError || !strings.Contains(resText(bad), "an approver may grant: *.example.org") {
		t.Errorf("evil.com: %q", resText(bad))
	}
}

// A call that cannot be recorded does not run.
func TestUnwritableAuditRefusesToRun(t *testing.T) {
	f := newFixture(t, "off", time.Second)
	dir := t.TempDir()
	f.h.Audit = approval.NewAudit(filepath.Join(dir, "missing-parent", "sub", "audit.jsonl"), 0)
	if err := os.WriteFile(filepath.Join(dir, "missing-parent"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res := raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)"}, "", nil))
	if !res.IsError || f.rt.count() != 0 || !strings.Contains(resText(res), "audit log cannot be written") {
		t.Errorf("result %q runs=%d; want a refusal naming the audit log", resText(res), f.rt.count())
	}
}

// Every kind of call leaves exactly one well-formed record.
func TestOneRecordPerCall(t *testing.T) {
	f := newFixture(t, "off", time.Second)
	calls := []map[string]any{
		{"code": "print(1)"},
		{"code": ""},
		{"code": 5.0},
		{"code": "x", "timeout_s": 99999.0},
		{},
	}
	for _, args := range calls {
		raw(t, f, "alice", modernCall(t, args, "", nil))
	}
	recs := f.records(t)
	if len(recs) != len(calls) {
		t.Fatalf("%d records for %d calls", len(recs), len(calls))
	}
	if recs[0].Outcome != approval.OutcomeRan || recs[0].Decision != approval.DecisionAuto || recs[0].Code != "print(1)" || recs[0].CodeSHA256 != approval.CodeSHA256("print(1)") {
		t.Errorf("ran record = %+v", recs[0])
	}
	for _, r := range recs[1:] {
		if r.Outcome != approval.OutcomeInvalid || r.ExitCode != nil || r.Error == "" || r.Client != "alice" {
			t.Errorf("invalid call record = %+v", r)
		}
	}
}

// A result carries the hash of its call's audit line.
func TestResultCarriesAuditRecord(t *testing.T) {
	f := newFixture(t, "off", time.Second)
	res := raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)"}, "", nil))
	sc, _ := res.StructuredContent.(map[string]any)
	hash, _ := sc["audit_record"].(string)
	id, _ := sc["run_id"].(string)
	if res.IsError || len(hash) != 64 || id == "" {
		t.Fatalf("result %q, structured content %v; want audit_record, a SHA-256", resText(res), sc)
	}
	data, err := os.ReadFile(f.audit)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		var r approval.Record
		if json.Unmarshal([]byte(line), &r) == nil && r.ID == id {
			if got := approval.LineHash([]byte(line)); got != hash {
				t.Errorf("audit_record %s, but the record's line hashes to %s", hash, got)
			}
			return
		}
	}
	t.Errorf("no audit record of run %s", id)
}

// The console: list, approve, see the result; and its refusals.
func TestConsole(t *testing.T) {
	f := newFixture(t, "always", 10*time.Second)
	secret := "0123456789abcdef0123"
	ts := httptest.NewUnstartedServer(nil)
	ts.Start()
	defer ts.Close()
	host := strings.TrimPrefix(ts.URL, "http://")
	con, err := approval.NewConsole(f.h.Gate, approval.ConsoleOptions{Tokens: []approval.Token{{Name: "carol", Secret: secret}}, Hosts: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	ts.Config.Handler = con
	f.h.Gate.SetConsole(true)
	cc := &approval.ConsoleClient{URL: ts.URL, Token: secret}

	// A call from a client without elicitation waits on the console.
	done := make(chan *mcp.CallToolResult, 1)
	legacy := func(code string) {
		msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "run_python", "arguments": map[string]any{"code": code}}})
		done <- raw(t, f, "bob", msg)
	}
	go legacy("print('from bob')")
	var pend approval.Requests
	waitFor(t, func() bool {
		pend, err = cc.List(t.Context())
		return err == nil && len(pend.Pending) == 1
	})
	p := pend.Pending[0]
	if p.Client != "bob" || !strings.Contains(p.Code, "print('from bob')") || !strings.Contains(p.Description, "Approve this run_python call?") {
		t.Errorf("pending view = %+v", p)
	}
	if err := cc.Decide(t.Context(), p.ID, true); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.IsError || f.rt.count() != 1 {
		t.Fatalf("approved call: %q runs=%d", resText(res), f.rt.count())
	}
	after, _ := cc.List(t.Context())
	if len(after.Recent) != 1 || after.Recent[0].Outcome != approval.OutcomeRan || !strings.Contains(after.Recent[0].Stdout, "from bob") || after.Recent[0].Approver != "console:carol" {
		t.Errorf("recent = %+v, want the approved run's result", after.Recent)
	}
	// A second decision of the same request is refused.
	var ce *approval.ConsoleError
	if err := cc.Decide(t.Context(), p.ID, true); !errors.As(err, &ce) || ce.Status != http.StatusConflict {
		t.Errorf("second decision: %v, want 409", err)
	}
	recs := f.records(t)
	if len(recs) != 1 || recs[0].Channel != approval.ChannelConsole || recs[0].Approver != "console:carol" {
		t.Errorf("records = %+v", recs)
	}

	t.Run("deny", func(t *testing.T) {
		go legacy("print('denied')")
		waitFor(t, func() bool { pend, err = cc.List(t.Context()); return err == nil && len(pend.Pending) == 1 })
		if err := cc.Decide(t.Context(), pend.Pending[0].ID, false); err != nil {
			t.Fatal(err)
		}
		if res := <-done; !res.IsError || !strings.Contains(resText(res), "console:carol denied") || f.rt.count() != 1 {
			t.Errorf("denied call: %q runs=%d", resText(res), f.rt.count())
		}
	})
	t.Run("decision after expiry", func(t *testing.T) {
		f.h.Gate.Timeout = 200 * time.Millisecond
		defer func() { f.h.Gate.Timeout = 10 * time.Second }()
		go legacy("print('late')")
		waitFor(t, func() bool { pend, err = cc.List(t.Context()); return err == nil && len(pend.Pending) == 1 })
		id := pend.Pending[0].ID
		res := <-done
		if !res.IsError || !strings.Contains(resText(res), "expired") {
			t.Errorf("unanswered call: %q", resText(res))
		}
		if err := cc.Decide(t.Context(), id, true); !errors.As(err, &ce) || ce.Status != http.StatusGone {
			t.Errorf("late decision: %v, want 410", err)
		}
		if f.rt.count() != 1 {
			t.Errorf("late approval ran code")
		}
	})
	t.Run("elicitation requests are not the console's", func(t *testing.T) {
		res := raw(t, f, "alice", modernCall(t, map[string]any{"code": "print(1)"}, "", nil))
		if err := cc.Decide(t.Context(), res.RequestState, true); !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
			t.Errorf("console decided an elicitation request: %v", err)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			req    func() *http.Request
			status int
		}{
			{"no token", func() *http.Request { r, _ := http.NewRequest("GET", ts.URL+"/api/requests", nil); return r }, 401},
			{"wrong token", func() *http.Request {
				r, _ := http.NewRequest("GET", ts.URL+"/api/requests", nil)
				r.Header.Set("Authorization", "Bearer wrong-token-wrong-token")
				return r
			}, 401},
			{"foreign origin", func() *http.Request {
				r, _ := http.NewRequest("POST", ts.URL+"/api/requests/x/approve", nil)
				r.Header.Set("Authorization", "Bearer "+secret)
				r.Header.Set("Origin", "http://evil.example")
				return r
			}, 403},
			{"rebinding host", func() *http.Request {
				r, _ := http.NewRequest("GET", ts.URL+"/api/requests", nil)
				r.Host = "attacker.example:80"
				r.Header.Set("Authorization", "Bearer "+secret)
				return r
			}, 421},
		} {
			resp, err := http.DefaultClient.Do(tc.req())
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.status)
			}
			if tc.status == 401 && !strings.Contains(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s: no WWW-Authenticate", tc.name)
			}
		}
		resp, err := http.Get(ts.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("page CSP = %q", csp)
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A request waiting for the console, or for an elicitation/create answer,
// can be decided only there: the requesting client that presents its id
// back with an "accept" in a retry is refused, by either protocol
// generation, and nothing runs. (Issue 14.1: the retry used to approve.)
func TestRetryCannotDecideAnotherChannel(t *testing.T) {
	f := newFixture(t, "always", 10*time.Second)
	f.h.Gate.SetConsole(true)
	legacyRetry := func(code, state string) json.RawMessage {
		msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{
			"name": "run_python", "arguments": map[string]any{"code": code},
			"requestState": state, "inputResponses": accept(),
		}})
		return msg
	}
	for _, tc := range []struct {
		name  string
		retry func(code, state string) json.RawMessage
	}{
		{"2026-07-28 retry", func(code, state string) json.RawMessage {
			return modernCall(t, map[string]any{"code": code}, state, accept())
		}},
		{"2025-11-25 retry", legacyRetry},
	} {
		t.Run("console request, "+tc.name, func(t *testing.T) {
			code := "print('self-approved " + tc.name + "')"
			done := make(chan *mcp.CallToolResult, 1)
			go func() {
				msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "run_python", "arguments": map[string]any{"code": code}}})
				done <- raw(t, f, "mallory", msg)
			}()
			var pend []*approval.Pending
			waitFor(t, func() bool { pend = f.h.Gate.Pending(); return len(pend) == 1 })
			id := pend[0].ID
			res := raw(t, f, "mallory", tc.retry(code, id))
			if !res.IsError || !strings.Contains(resText(res), "no approval request with that id is waiting for this client") {
				t.Errorf("self-approval retry answered %q, want a refusal", resText(res))
			}
			if f.rt.count() != 0 {
				t.Fatalf("the retry ran code: %d runs", f.rt.count())
			}
			if _, decided := pend[0].Decided(); decided {
				t.Fatal("the retry decided the console's request")
			}
			// The console still decides it.
			if err := f.h.Gate.DecideConsole(id, false, "console:carol"); err != nil {
				t.Fatal(err)
			}
			if r := <-done; !r.IsError || f.rt.count() != 0 {
				t.Errorf("denied call: %q runs=%d", resText(r), f.rt.count())
			}
		})
	}
	t.Run("elicitation/create request", func(t *testing.T) {
		// An old-protocol client that can elicit is asked through
		// elicitation/create; its retry must not answer in its place.
		a := &answer{block: true}
		c := inProcess(t, f, a, mcp.ProtocolVersion20251125)
		var pend []*approval.Pending
		ctx, cancel := context.WithCancel(t.Context())
		called := make(chan struct{})
		go func() {
			defer close(called)
			var req mcp.CallToolRequest
			req.Params.Name = "run_python"
			req.Params.Arguments = map[string]any{"code": "print('elicited')"}
			_, _ = c.CallTool(ctx, req)
		}()
		waitFor(t, func() bool { pend = f.h.Gate.Ledger().List(""); return len(pend) == 1 })
		p := pend[0]
		res := raw(t, f, p.Request.Client, legacyRetry("print('elicited')", p.ID))
		if !res.IsError || f.rt.count() != 0 {
			t.Errorf("retry of an elicitation/create request: %q runs=%d", resText(res), f.rt.count())
		}
		if _, decided := p.Decided(); decided {
			t.Fatal("the retry decided an elicitation/create request")
		}
		// End the blocked call and wait until its audit record is
		// written: a write after the test returns races TempDir's
		// removal (seen in CI as "directory not empty").
		cancel()
		<-called
		waitFor(t, func() bool {
			for _, r := range f.records(t) {
				if r.ApprovalID == p.ID {
					return true
				}
			}
			return false
		})
	})
}
