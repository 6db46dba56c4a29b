package tools

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/config"
)

// clock is a registry's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestTasks(ttl time.Duration, keep int) (*taskRegistry, *clock) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	return &taskRegistry{cfg: config.TasksConfig{ResultTTL: ttl, MaxKept: keep}, now: c.now}, c
}

func TestTaskResultIsKeptForResultTTLOnly(t *testing.T) {
	r, c := newTestTasks(time.Minute, 10)
	r.created(nil, "t1", "alice", "run_python")
	t1 := r.owned("t1", "alice")
	if t1 == nil {
		t.Fatal("a running task is not its owner's")
	}
	c.t = c.t.Add(time.Hour) // running tasks never expire
	if r.owned("t1", "alice") == nil {
		t.Fatal("a task still running was forgotten")
	}
	r.finish(t1, mcp.NewToolResultText("done"))
	c.t = c.t.Add(time.Minute - time.Second)
	if r.owned("t1", "alice") == nil {
		t.Fatal("forgotten before tasks.result_ttl passed")
	}
	c.t = c.t.Add(time.Second)
	if r.owned("t1", "alice") != nil {
		t.Fatal("kept after tasks.result_ttl passed")
	}
}

func TestTasksAreSeenOnlyByTheirCaller(t *testing.T) {
	r, _ := newTestTasks(time.Minute, 10)
	r.created(nil, "t1", "alice", "run_python")
	for _, tc := range []struct{ id, caller string }{{"t1", "bob"}, {"t1", ""}, {"t2", "alice"}, {"", "alice"}} {
		if r.owned(tc.id, tc.caller) != nil {
			t.Errorf("task %q seen by %q", tc.id, tc.caller)
		}
	}
}

func TestTasksMaxKeptDropsTheOldestEnded(t *testing.T) {
	r, c := newTestTasks(time.Hour, 2)
	for _, id := range []string{"a", "b", "c"} {
		r.created(nil, id, "alice", "run_python")
		r.finish(r.owned(id, "alice"), mcp.NewToolResultText(id))
		c.t = c.t.Add(time.Second)
	}
	r.created(nil, "running", "alice", "run_python") // prunes
	r.created(nil, "bobs", "bob", "run_python")
	if r.owned("a", "alice") != nil {
		t.Error("the oldest ended task is kept past tasks.max_kept")
	}
	for _, id := range []string{"b", "c", "running"} {
		if r.owned(id, "alice") == nil {
			t.Errorf("task %s dropped", id)
		}
	}
}

func TestTaskCancelBeforeTheRunStartsStillCancelsIt(t *testing.T) {
	r, _ := newTestTasks(time.Minute, 10)
	key := &server.RequestProtocolInfo{}
	r.created(key, "t1", "alice", "run_python")
	r.cancelled("t1")
	t1 := r.claim(key)
	if t1 == nil || r.claim(key) != nil {
		t.Fatal("claim: want the task once")
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	r.started(t1, cancel)
	if !errors.Is(context.Cause(ctx), errCancelledByTask) {
		t.Fatalf("cause %v, want errCancelledByTask", context.Cause(ctx))
	}
}

func TestTaskStatusShowsOutputTailAndApproval(t *testing.T) {
	r, _ := newTestTasks(time.Minute, 10)
	r.created(nil, "t1", "alice", "run_python")
	t1 := r.owned("t1", "alice")
	r.note(t1, strings.Repeat("x", taskStatusBytes)+"é last line\n")
	view := mcp.NewTask("t1")
	r.patch(t1, &view)
	if len(view.StatusMessage) > taskStatusBytes || !strings.HasSuffix(view.StatusMessage, "é last line\n") {
		t.Fatalf("status message %d bytes ending %q", len(view.StatusMessage), view.StatusMessage[max(0, len(view.StatusMessage)-20):])
	}
	done := r.asking(t1)
	view = mcp.NewTask("t1")
	r.patch(t1, &view)
	if view.Status != mcp.TaskStatusInputRequired {
		t.Fatalf("status %q while approval is asked, want input_required", view.Status)
	}
	done()
	view = mcp.NewTask("t1")
	r.patch(t1, &view)
	if view.Status != mcp.TaskStatusWorking {
		t.Fatalf("status %q after approval, want working", view.Status)
	}
	ended := mcp.NewTask("t1", mcp.WithTaskStatus(mcp.TaskStatusCompleted))
	r.patch(t1, &ended)
	if ended.StatusMessage != "" {
		t.Fatal("an ended task's status was patched")
	}
}

func TestCheckTaskRequest(t *testing.T) {
	h := &Handlers{}
	h.tasks.cfg = config.Defaults().Tasks
	h.tasks.created(nil, "t1", "alice", "run_python")
	for _, tc := range []struct {
		name, caller, msg string
		refused           bool
	}{
		{"owner gets", "alice", `{"method":"tasks/get","params":{"taskId":"t1"}}`, false},
		{"other client gets", "bob", `{"method":"tasks/get","params":{"taskId":"t1"}}`, true},
		{"other client cancels", "bob", `{"method":"tasks/cancel","params":{"taskId":"t1"}}`, true},
		{"other client's result", "bob", `{"method":"tasks/result","params":{"taskId":"t1"}}`, true},
		{"unknown task", "alice", `{"method":"tasks/result","params":{"taskId":"nope"}}`, true},
		{"list is filtered, not refused", "bob", `{"method":"tasks/list","params":{}}`, false},
		{"task call, 2025-11-25", "bob", `{"method":"tools/call","params":{"name":"run_python","task":{}}}`, false},
		{"task call, stateless", "bob", `{"method":"tools/call","params":{"name":"run_python","task":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, true},
		{"plain call, stateless", "bob", `{"method":"tools/call","params":{"name":"run_python","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := h.checkTaskRequest(tc.caller, json.RawMessage(tc.msg))
			if (err != nil) != tc.refused {
				t.Fatalf("refused=%v (%v), want %v", err != nil, err, tc.refused)
			}
		})
	}
}

// A run still going when the ttl its client asked for passes is cancelled
// with errTaskExpired; a call without task runs on the caller's context.
func TestTaskableHonoursTheClientsTTL(t *testing.T) {
	h := &Handlers{}
	h.tasks.cfg = config.Defaults().Tasks
	var cause error
	inner := func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return mcp.NewToolResultText("ended"), nil
	}
	key := &server.RequestProtocolInfo{}
	h.tasks.created(key, "t1", "alice", "run_python")
	// mcp-go's context is cancelled once the call is answered: the run
	// must not end with it.
	reqCtx, cancelReq := context.WithCancel(server.WithRequestProtocolInfo(context.Background(), key))
	cancelReq()
	ttl := int64(50)
	var req mcp.CallToolRequest
	req.Params.Task = &mcp.TaskParams{TTL: &ttl}
	start := time.Now()
	res, err := h.taskable(inner)(reqCtx, req)
	if err != nil || res == nil {
		t.Fatalf("taskable: %v %v", res, err)
	}
	if !errors.Is(cause, errTaskExpired) || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("run ended after %v with cause %v, want errTaskExpired at the ttl", time.Since(start), cause)
	}
	kept := h.tasks.owned("t1", "alice")
	if kept == nil || kept.result == nil || kept.result.Content[0].(mcp.TextContent).Text != "ended" {
		t.Fatal("the run's own result is not kept for tasks/result")
	}
}
