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

func call(t *testing.T, m *countingManager, tool string, args any) *mcp.CallToolResult {
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
		r := call(t, m, "run_python", args)
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
			r := call(t, m, "run_shell", map[string]any{"command": "true", "timeout_s": 5.0})
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
