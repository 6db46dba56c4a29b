package tools

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// countingManager is a stand-in for one function's unit test: it records
// whether the runtime was reached and returns a canned answer.
type countingManager struct {
	calls int
	last  runtime.Request
	res   runtime.Result
	err   error
}

func (m *countingManager) Run(_ context.Context, r runtime.Request) (runtime.Result, error) {
	m.calls++
	m.last = r
	return m.res, m.err
}
func (m *countingManager) Close(context.Context) error { return nil }

func callTool(t *testing.T, m *countingManager, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	h := &Handlers{Manager: m, Limits: config.Defaults().Limits, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	key, lang := "code", runtime.Python
	if tool == "run_shell" {
		key, lang = "command", runtime.Shell
	}
	var req mcp.CallToolRequest
	req.Params.Name, req.Params.Arguments = tool, args
	res, err := h.handler(tool, key, lang)(context.Background(), req)
	if err != nil {
		t.Fatalf("handler returned a protocol error: %v", err)
	}
	return res
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestBadArgumentsNeverReachRuntime(t *testing.T) {
	for _, args := range []any{nil, map[string]any{}, map[string]any{"code": ""}, map[string]any{"code": 1.0}, map[string]any{"code": "x", "_meta": 1}} {
		m := &countingManager{}
		r := callTool(t, m, "run_python", args)
		if !r.IsError || m.calls != 0 || r.StructuredContent != nil {
			t.Errorf("args %v: isError=%v runtime calls=%d structured=%v", args, r.IsError, m.calls, r.StructuredContent)
		}
	}
}

func TestResultMapping(t *testing.T) {
	cases := []struct {
		name    string
		res     runtime.Result
		err     error
		isError bool
		text    string
	}{
		{"ok", runtime.Result{Stdout: "42\n"}, nil, false, "42"},
		{"non-zero exit", runtime.Result{ExitCode: 3, Stderr: "boom"}, nil, true, "Exit code 3"},
		{"timeout", runtime.Result{ExitCode: 137, TimedOut: true, Reason: runtime.ReasonTimeout}, nil, true, "Timed out"},
		{"oom", runtime.Result{ExitCode: 137, OOMKilled: true, Reason: runtime.ReasonOutOfMemory}, nil, true, "Out of memory"},
		{"capped but ok", runtime.Result{StdoutTruncated: true, Reason: runtime.ReasonOutputCapped}, nil, false, "cut at its cap"},
		{"busy", runtime.Result{}, runtime.ErrBusy, true, "busy"},
		{"infrastructure", runtime.Result{}, &runtime.InfraError{Op: "create sandbox", Err: errors.New("secret detail /run/x")}, true, "airlock doctor"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &countingManager{res: c.res, err: c.err}
			r := callTool(t, m, "run_shell", map[string]any{"command": "true", "timeout_s": 5.0})
			if r.IsError != c.isError || !strings.Contains(text(r), c.text) {
				t.Errorf("isError=%v text=%q; want %v containing %q", r.IsError, text(r), c.isError, c.text)
			}
			if strings.Contains(text(r), "secret detail") {
				t.Error("infrastructure detail leaked to the client")
			}
			if m.last.Limits.Timeout.Seconds() != 5 || m.last.Language != runtime.Shell {
				t.Errorf("request = %+v", m.last)
			}
			if c.err == nil {
				out, ok := r.StructuredContent.(RunOutput)
				if !ok || out.ExitCode != c.res.ExitCode || out.TimedOut != c.res.TimedOut || out.Reason != c.res.Reason {
					t.Errorf("structuredContent = %#v", r.StructuredContent)
				}
			}
		})
	}
}

func TestNetworkPolicyPerCall(t *testing.T) {
	op, err := egress.ParsePolicy([]string{"pypi.org", "*.example.com"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name        string
		egress      *egress.Policy
		defaultMode string
		args        map[string]any
		wantErr     string
		wantDomains []string // nil: no network
	}{
		{"default none", &op, "", map[string]any{"code": "x"}, "", nil},
		{"asks allowlist", &op, "", map[string]any{"code": "x", "network": "allowlist"}, "", []string{"*.example.com", "pypi.org"}},
		{"default allowlist", &op, "allowlist", map[string]any{"code": "x"}, "", []string{"*.example.com", "pypi.org"}},
		{"narrows", &op, "", map[string]any{"code": "x", "network": "allowlist", "allow_domains": []any{"a.example.com"}}, "", []string{"a.example.com"}},
		{"widening refused", &op, "", map[string]any{"code": "x", "network": "allowlist", "allow_domains": []any{"evil.com"}}, "evil.com", nil},
		{"no network offered", nil, "", map[string]any{"code": "x", "network": "allowlist"}, "offers no network", nil},
		{"explicit none beats default", &op, "allowlist", map[string]any{"code": "x", "network": "none"}, "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &countingManager{}
			h := &Handlers{Manager: m, Limits: config.Defaults().Limits, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Egress: c.egress, DefaultNetwork: c.defaultMode}
			var req mcp.CallToolRequest
			req.Params.Arguments = c.args
			r, _ := h.handler("run_python", "code", runtime.Python)(context.Background(), req)
			if c.wantErr != "" {
				if !r.IsError || !strings.Contains(text(r), c.wantErr) || m.calls != 0 {
					t.Fatalf("isError=%v text=%q calls=%d; want a refusal naming %q", r.IsError, text(r), m.calls, c.wantErr)
				}
				return
			}
			if m.calls != 1 {
				t.Fatalf("runtime not called: %q", text(r))
			}
			if c.wantDomains == nil {
				if m.last.Egress != nil {
					t.Errorf("run got a network: %v", m.last.Egress)
				}
				return
			}
			if m.last.Egress == nil || strings.Join(m.last.Egress.Domains(), ",") != strings.Join(c.wantDomains, ",") {
				t.Errorf("egress = %v, want %v", m.last.Egress, c.wantDomains)
			}
		})
	}
}

func TestDenialsInResult(t *testing.T) {
	m := &countingManager{res: runtime.Result{ExitCode: 6, EgressDenied: []egress.Denial{{Host: "evil.com", Port: 443, Reason: egress.ReasonNotAllowed}}}}
	r := callTool(t, m, "run_shell", map[string]any{"command": "curl https://evil.com"})
	out := r.StructuredContent.(RunOutput)
	if len(out.EgressDenied) != 1 || out.EgressDenied[0] != (DeniedOut{Host: "evil.com", Port: 443, Reason: "not in allow-list"}) {
		t.Errorf("egress_denied = %+v", out.EgressDenied)
	}
	if !strings.Contains(text(r), "evil.com:443: not in allow-list") {
		t.Errorf("text lacks the denial: %q", text(r))
	}
	// No denials is an empty list, not null, so the output schema holds.
	m.res = runtime.Result{}
	if out := callTool(t, m, "run_shell", map[string]any{"command": "true"}).StructuredContent.(RunOutput); out.EgressDenied == nil {
		t.Error("egress_denied is null")
	}
}

func TestNetworkArgumentsOnlyWhenOffered(t *testing.T) {
	op, _ := egress.ParsePolicy([]string{"pypi.org"}, nil, nil)
	for _, c := range []struct {
		egress *egress.Policy
		want   bool
	}{{nil, false}, {&op, true}} {
		h := &Handlers{Limits: config.Defaults().Limits, Egress: c.egress}
		tool := h.tool("run_python", "code", "d", "t")
		_, hasNet := tool.InputSchema.Properties["network"]
		_, hasAllow := tool.InputSchema.Properties["allow_domains"]
		if hasNet != c.want || hasAllow != c.want || *tool.Annotations.OpenWorldHint != c.want {
			t.Errorf("egress=%v: network=%v allow_domains=%v openWorld=%v, want %v", c.egress != nil, hasNet, hasAllow, *tool.Annotations.OpenWorldHint, c.want)
		}
	}
}
