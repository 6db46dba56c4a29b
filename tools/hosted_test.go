package tools_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/server"
	"github.com/airlock-mcp/airlock/tools"
)

// blocking runs until its context ends, printing as it goes: a stand-in for
// a long sandbox run that honours cancellation as the real one does.
type blocking struct {
	started chan string
	chunks  []string
}

func (b *blocking) Run(ctx context.Context, r runtime.Request) (runtime.Result, error) {
	b.started <- r.RunID
	for _, c := range b.chunks {
		if r.Output != nil {
			r.Output(runtime.Stdout, []byte(c))
		}
		time.Sleep(30 * time.Millisecond)
	}
	if len(b.chunks) > 0 {
		return runtime.Result{RunID: r.RunID, Stdout: strings.Join(b.chunks, "")}, nil
	}
	<-ctx.Done()
	return runtime.Result{RunID: r.RunID}, ctx.Err()
}
func (b *blocking) Close(context.Context) error { return nil }

func newHosted(t *testing.T, rt runtime.Manager) *tools.Handlers {
	t.Helper()
	return &tools.Handlers{Manager: rt, Limits: config.Defaults().Limits, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func callAs(h *tools.Handlers, who, tool string, args map[string]any) *mcp.CallToolResult {
	s := server.New("test", h)
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": args}})
	resp := s.HandleMessage(tools.WithCaller(context.Background(), tools.Caller{ID: who, Transport: "test"}), msg)
	b, _ := json.Marshal(resp)
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	_ = json.Unmarshal(b, &env)
	res, _ := mcp.ParseCallToolResult(&env.Result)
	return res
}

// A client sees and cancels only its own runs.
func TestRunsAreTheCallersOwn(t *testing.T) {
	rt := &blocking{started: make(chan string, 1)}
	h := newHosted(t, rt)
	done := make(chan *mcp.CallToolResult, 1)
	go func() { done <- callAs(h, "alice", "run_python", map[string]any{"code": "long()"}) }()
	id := <-rt.started

	bobList := callAs(h, "bob", "list_runs", nil)
	if strings.Contains(resText(bobList), id) {
		t.Errorf("bob sees alice's run: %s", resText(bobList))
	}
	if r := callAs(h, "bob", "cancel_run", map[string]any{"run_id": id}); !r.IsError || !strings.Contains(resText(r), "No run") {
		t.Errorf("bob cancelled alice's run: %s", resText(r))
	}
	aliceList := callAs(h, "alice", "list_runs", nil)
	if !strings.Contains(resText(aliceList), id+" run_python running") {
		t.Errorf("alice does not see her running run: %s", resText(aliceList))
	}
	select {
	case r := <-done:
		t.Fatalf("alice's run ended early: %s", resText(r))
	case <-time.After(100 * time.Millisecond):
	}
	if r := callAs(h, "alice", "cancel_run", map[string]any{"run_id": id}); r.IsError {
		t.Fatalf("alice could not cancel her run: %s", resText(r))
	}
	if r := <-done; !r.IsError || !strings.Contains(resText(r), "cancelled") {
		t.Errorf("cancelled run answered %q", resText(r))
	}
	if l := resText(callAs(h, "alice", "list_runs", nil)); !strings.Contains(l, id+" run_python finished") {
		t.Errorf("alice's finished run not listed: %s", l)
	}
}

// Drain lets runs finish within the grace, cancels the rest, refuses new ones.
func TestDrain(t *testing.T) {
	rt := &blocking{started: make(chan string, 1)}
	h := newHosted(t, rt)
	done := make(chan *mcp.CallToolResult, 1)
	go func() { done <- callAs(h, "alice", "run_python", map[string]any{"code": "long()"}) }()
	<-rt.started
	start := time.Now()
	h.Drain(200 * time.Millisecond)
	if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
		t.Errorf("Drain took %v", d)
	}
	if r := <-done; !r.IsError || !strings.Contains(resText(r), "shutting down") {
		t.Errorf("run past the grace answered %q", resText(r))
	}
	if r := callAs(h, "alice", "run_python", map[string]any{"code": "print(1)"}); !r.IsError || !strings.Contains(resText(r), "shutting down") {
		t.Errorf("call during shutdown answered %q", resText(r))
	}
	if h.InFlight() != 0 {
		t.Errorf("%d calls still registered", h.InFlight())
	}
}

// Per-client limits are enforced per caller.
func TestPerClientConcurrency(t *testing.T) {
	rt := &blocking{started: make(chan string, 2)}
	h := newHosted(t, rt)
	h.Quotas = &tools.Quotas{Concurrent: 1, PerMinute: 100}
	done := make(chan *mcp.CallToolResult, 2)
	go func() { done <- callAs(h, "alice", "run_python", map[string]any{"code": "long()"}) }()
	id := <-rt.started
	if r := callAs(h, "alice", "run_python", map[string]any{"code": "again()"}); !r.IsError || !strings.Contains(resText(r), "per_client_concurrency") {
		t.Errorf("alice's second run: %q", resText(r))
	}
	go func() { done <- callAs(h, "bob", "run_python", map[string]any{"code": "other()"}) }()
	bobID := <-rt.started
	callAs(h, "alice", "cancel_run", map[string]any{"run_id": id})
	callAs(h, "bob", "cancel_run", map[string]any{"run_id": bobID})
	<-done
	<-done
}

// Output streams as progress and log notifications while the run goes.
func TestProgressNotifications(t *testing.T) {
	rt := &blocking{started: make(chan string, 1), chunks: []string{"one\n", "two\n", "three\n"}}
	h := newHosted(t, rt)
	h.ProgressInterval = 10 * time.Millisecond
	c, err := client.NewInProcessClient(server.New("test", h))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var progress, logs []string
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		mu.Lock()
		defer mu.Unlock()
		b, _ := json.Marshal(n.Params)
		switch n.Method {
		case "notifications/progress":
			progress = append(progress, string(b))
		case "notifications/message":
			logs = append(logs, string(b))
		}
	})
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var init mcp.InitializeRequest
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	if _, err := c.Initialize(t.Context(), init); err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 clients on 2025-11-25 set their log level this way
	if err := c.SetLevel(t.Context(), mcp.SetLevelRequest{Params: mcp.SetLevelParams{Level: mcp.LoggingLevelInfo}}); err != nil {
		t.Fatal(err)
	}
	var req mcp.CallToolRequest
	req.Params.Name = "run_python"
	req.Params.Arguments = map[string]any{"code": "x"}
	req.Params.Meta = &mcp.Meta{ProgressToken: "tok-1"}
	res, err := c.CallTool(t.Context(), req)
	if err != nil || res.IsError {
		t.Fatalf("call: %v %s", err, resText(res))
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(progress, "")
	for _, want := range []string{"one", "two", "three", `"progressToken":"tok-1"`} {
		if !strings.Contains(all, want) {
			t.Errorf("progress notifications %v lack %q", progress, want)
		}
	}
	if !strings.Contains(strings.Join(logs, ""), `"stream":"stdout"`) {
		t.Errorf("log notifications = %v", logs)
	}
}
