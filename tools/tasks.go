package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/config"
)

// Runs as MCP tasks (protocol 2025-11-25). mcp-go creates the task, answers
// the call at once and keeps the task's status; airlock keeps what mcp-go
// does not do for it:
//   - the run itself, on a context of its own: mcp-go's is cancelled as
//     soon as the call is answered, and a task outlives its connection;
//   - who owns a task: mcp-go checks only the transport session, and not
//     at all when either side has none, so every tasks/* request is checked
//     here against the caller that created the task;
//   - the result, held here for tasks.result_ttl after the run and handed
//     to tasks/result, so that mcp-go's own record (which stays until the
//     client's ttl, for ever without one) holds a few bytes, not images;
//   - the status: the run's latest output while it runs, and
//     input_required while the client's user is asked to approve it;
//   - tasks/cancel, which reaches the run through mcp-go's cancel hook.

// taskStatusBytes bounds the output a task's status message carries.
const taskStatusBytes = 2 << 10

// errCancelledByTask cancels a run through tasks/cancel.
var errCancelledByTask = errors.New("cancelled with tasks/cancel")

// errTaskExpired cancels a run still going when the ttl the client asked
// for its task has passed: mcp-go forgets the task then.
var errTaskExpired = errors.New("the task's ttl passed before the run ended")

// task is one task-mode call as airlock keeps it.
type task struct {
	id      string
	caller  string
	tool    string
	created time.Time

	// Under the registry's lock:
	cancel    context.CancelCauseFunc // set when the run starts
	cancelled bool                    // tasks/cancel came, maybe before the run started
	input     bool                    // the client's user is being asked to approve
	output    string                  // the run's latest output, at most taskStatusBytes
	result    *mcp.CallToolResult     // set when the run ends
	ended     time.Time
}

// taskRegistry holds the tasks of every client.
type taskRegistry struct {
	mu sync.Mutex
	// byID are tasks running and tasks ended less than ttl ago.
	byID map[string]*task
	// byRequest links the call mcp-go made a task of to the task, for the
	// handler, which mcp-go does not tell its task's id.
	byRequest map[*server.RequestProtocolInfo]*task
	cfg       config.TasksConfig
	now       func() time.Time
}

func (r *taskRegistry) init() {
	if r.byID == nil {
		r.byID, r.byRequest = map[string]*task{}, map[*server.RequestProtocolInfo]*task{}
	}
	if r.now == nil {
		r.now = time.Now
	}
}

// configure sets tasks.result_ttl and tasks.max_kept.
func (r *taskRegistry) configure(cfg config.TasksConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cfg = cfg
}

// result is t's kept result, nil while it runs.
func (r *taskRegistry) result(t *task) *mcp.CallToolResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return t.result
}

// created records a task mcp-go just made for caller's call.
func (r *taskRegistry) created(key *server.RequestProtocolInfo, id, caller, tool string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	t := &task{id: id, caller: caller, tool: tool, created: r.now()}
	r.byID[id] = t
	if key != nil {
		r.byRequest[key] = t
	}
	r.pruneLocked(caller)
}

// claim returns the task made of the call whose request carried key, once.
func (r *taskRegistry) claim(key *server.RequestProtocolInfo) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	t := r.byRequest[key]
	delete(r.byRequest, key)
	return t
}

// started gives t the cancel of its run; a cancel that came first is
// applied at once.
func (r *taskRegistry) started(t *task, cancel context.CancelCauseFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.cancel = cancel
	if t.cancelled {
		cancel(errCancelledByTask)
	}
}

// cancelled is mcp-go's word that the task was cancelled.
func (r *taskRegistry) cancelled(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	if t := r.byID[id]; t != nil {
		t.cancelled = true
		if t.cancel != nil {
			t.cancel(errCancelledByTask)
		}
	}
}

// finish keeps the run's result for tasks/result.
func (r *taskRegistry) finish(t *task, res *mcp.CallToolResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.result, t.ended, t.cancel, t.input = res, r.now(), nil, false
}

// note keeps the tail of the run's output as its status.
func (r *taskRegistry) note(t *task, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := t.output + text
	if len(s) > taskStatusBytes {
		s = s[len(s)-taskStatusBytes:]
		for i := 0; i < len(s) && i < 4; i++ {
			if s[i]&0xC0 != 0x80 { // start of a UTF-8 character
				s = s[i:]
				break
			}
		}
	}
	t.output = s
}

// asking marks t input_required until the returned function is called.
func (r *taskRegistry) asking(t *task) func() {
	if t == nil {
		return func() {}
	}
	r.mu.Lock()
	t.input = true
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		t.input = false
		r.mu.Unlock()
	}
}

// owned returns caller's task id, or nil: not caller's, never made, or
// ended more than ResultTTL ago (then it is forgotten).
func (r *taskRegistry) owned(id, caller string) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.init()
	t := r.byID[id]
	if t == nil {
		return nil
	}
	if r.expiredLocked(t) {
		delete(r.byID, id)
		return nil
	}
	if t.caller != caller {
		return nil
	}
	return t
}

func (r *taskRegistry) expiredLocked(t *task) bool {
	return !t.ended.IsZero() && r.now().Sub(t.ended) >= r.cfg.ResultTTL
}

// pruneLocked forgets caller's expired tasks, then its oldest ended ones
// past MaxKept.
func (r *taskRegistry) pruneLocked(caller string) {
	var ended []*task
	for id, t := range r.byID {
		switch {
		case r.expiredLocked(t):
			delete(r.byID, id)
		case t.caller == caller && !t.ended.IsZero():
			ended = append(ended, t)
		}
	}
	for len(ended) > r.cfg.MaxKept {
		oldest := 0
		for i, t := range ended {
			if t.ended.Before(ended[oldest].ended) {
				oldest = i
			}
		}
		delete(r.byID, ended[oldest].id)
		ended = append(ended[:oldest], ended[oldest+1:]...)
	}
}

// patch shows, in mcp-go's view of a task still going, what airlock knows.
func (r *taskRegistry) patch(t *task, view *mcp.Task) {
	if view.Status.IsTerminal() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.input {
		view.Status = mcp.TaskStatusInputRequired
		view.StatusMessage = "waiting for the client's user to approve the run"
	} else if t.output != "" {
		view.StatusMessage = t.output
	}
}

type taskKey struct{}

// taskFrom returns the task the call runs as, or nil.
func taskFrom(ctx context.Context) *task {
	t, _ := ctx.Value(taskKey{}).(*task)
	return t
}

// taskable lets f run as a task. A call that asks for one runs f on a
// context of its own, which tasks/cancel or the ttl it asked for cancel,
// and not its connection ending; its result is kept here (see above) and
// mcp-go is given a stand-in.
func (h *Handlers) taskable(f server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if req.Params.Task == nil {
			return f(ctx, req)
		}
		t := h.tasks.claim(server.RequestProtocolInfoFromContext(ctx))
		if t == nil { // not a call mcp-go made a task of
			return f(ctx, req)
		}
		ctx, cancel := context.WithCancelCause(WithLifetime(context.WithoutCancel(ctx), nil))
		defer cancel(nil)
		h.tasks.started(t, cancel)
		if ttl := req.Params.Task.TTL; ttl != nil && *ttl > 0 {
			stop := time.AfterFunc(time.Until(t.created.Add(time.Duration(*ttl)*time.Millisecond)), func() { cancel(errTaskExpired) })
			defer stop.Stop()
		}
		res, err := f(context.WithValue(ctx, taskKey{}, t), req)
		if err != nil || res == nil {
			res = infraResult("internal error")
		}
		h.tasks.finish(t, res)
		return mcp.NewToolResultText(fmt.Sprintf("The result of task %s is kept by airlock for tasks.result_ttl; get it with tasks/result.", t.id)), nil
	}
}

// taskMethods are the tasks/* requests that name one task.
var taskMethods = map[string]bool{
	string(mcp.MethodTasksGet): true, string(mcp.MethodTasksResult): true, string(mcp.MethodTasksCancel): true,
}

// ServerOptions are the mcp-go options tasks need: the capability, and the
// hooks through which airlock keeps its part (above). Building them is
// what switches tasks on, so it also hands the registry tasks.* (the
// defaults where h.Tasks is unset): call it once, before serving.
func (h *Handlers) ServerOptions() []server.ServerOption {
	cfg := h.Tasks
	if cfg.ResultTTL <= 0 || cfg.MaxKept <= 0 {
		cfg = config.Defaults().Tasks
	}
	h.tasks.configure(cfg)
	th := &server.TaskHooks{}
	th.AddOnTaskCreated(func(ctx context.Context, m server.TaskMetrics) {
		h.tasks.created(server.RequestProtocolInfoFromContext(ctx), m.TaskID, CallerFrom(ctx).ID, m.ToolName)
	})
	th.AddOnTaskCancelled(func(_ context.Context, m server.TaskMetrics) { h.tasks.cancelled(m.TaskID) })

	hooks := &server.Hooks{}
	hooks.AddOnRequestInitialization(func(ctx context.Context, _ any, message any) error {
		raw, ok := message.(json.RawMessage)
		if !ok {
			return nil
		}
		return h.checkTaskRequest(CallerFrom(ctx).ID, raw)
	})
	hooks.AddAfterGetTask(func(ctx context.Context, _ any, req *mcp.GetTaskRequest, res *mcp.GetTaskResult) {
		if t := h.tasks.owned(req.Params.TaskId, CallerFrom(ctx).ID); t != nil {
			h.tasks.patch(t, &res.Task)
		}
	})
	hooks.AddAfterListTasks(func(ctx context.Context, _ any, _ *mcp.ListTasksRequest, res *mcp.ListTasksResult) {
		caller := CallerFrom(ctx).ID
		mine := res.Tasks[:0]
		for _, view := range res.Tasks {
			if t := h.tasks.owned(view.TaskId, caller); t != nil {
				h.tasks.patch(t, &view)
				mine = append(mine, view)
			}
		}
		res.Tasks = mine
	})
	hooks.AddAfterTaskResult(func(ctx context.Context, _ any, req *mcp.TaskResultRequest, res *mcp.TaskResultResult) {
		t := h.tasks.owned(req.Params.TaskId, CallerFrom(ctx).ID)
		if t == nil {
			return
		}
		if kept := h.tasks.result(t); kept != nil {
			res.Content, res.StructuredContent, res.IsError = kept.Content, kept.StructuredContent, kept.IsError
		}
	})
	return []server.ServerOption{
		server.WithTaskCapabilities(true, true, true),
		server.WithTaskHooks(th),
		server.WithHooks(hooks),
	}
}

// checkTaskRequest refuses, before mcp-go sees it, a tasks/* request for a
// task that is not the caller's, and a task-mode call over the stateless
// protocol (mcp-go keeps no result it could get).
func (h *Handlers) checkTaskRequest(caller string, raw json.RawMessage) error {
	var msg struct {
		Method string `json:"method"`
		Params struct {
			TaskID string          `json:"taskId"`
			Task   json.RawMessage `json:"task"`
			Meta   *mcp.Meta       `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(raw, &msg) != nil {
		return nil // mcp-go reports a malformed message itself
	}
	switch {
	case taskMethods[msg.Method]:
		if h.tasks.owned(msg.Params.TaskID, caller) == nil {
			return fmt.Errorf("no task %q for this client: tasks are seen only by the client that made them, and forgotten tasks.result_ttl (%s) after they end", msg.Params.TaskID, h.tasks.cfg.ResultTTL)
		}
	case msg.Method == string(mcp.MethodToolsCall) && len(msg.Params.Task) > 0 && !strings.EqualFold(string(msg.Params.Task), "null"):
		if mcp.IsModernProtocol(msg.Params.Meta.ProtocolVersion()) {
			return fmt.Errorf("tools run as tasks over protocol 2025-11-25 only; over %s call without \"task\", and cancel with cancel_run", msg.Params.Meta.ProtocolVersion())
		}
	}
	return nil
}
