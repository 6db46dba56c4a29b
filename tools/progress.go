package tools

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/runtime"
)

// Bounds of streamed output: a notification carries at most
// progressChunk bytes, and at most progressPending wait between two; what
// does not fit is counted and said, never queued without bound. The final
// result still carries the whole capped output.
const (
	progressChunk   = 8 << 10
	progressPending = 64 << 10
)

// progress streams a run's output to its client while it runs: as
// notifications/progress when the call carried a progress token, and as
// notifications/message (log) at the level the client asked for. Output is
// batched and sent at most once per interval, from its own goroutine, so a
// flooding sandbox neither blocks its output copier nor floods the client.
type progress struct {
	srv   *server.MCPServer
	ctx   context.Context
	token mcp.ProgressToken
	runID string
	// status, for a run that is a task, takes the output too: the task's
	// status shows it.
	status   func(string)
	interval time.Duration

	mu      sync.Mutex
	pending [2]strings.Builder // stdout, stderr
	dropped int
	sent    int64 // bytes of output streamed so far

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// newProgress starts streaming for one call, or returns nil when the
// client can receive neither kind of notification and the call is no task.
// A task's call was answered already, so its output goes to status (and
// log messages), not to progress notifications of that call.
func newProgress(ctx context.Context, srv *server.MCPServer, req mcp.CallToolRequest, runID string, interval time.Duration, status func(string)) *progress {
	if srv == nil || (server.ClientSessionFromContext(ctx) == nil && status == nil) {
		return nil
	}
	p := &progress{srv: srv, ctx: ctx, runID: runID, interval: interval, status: status,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if req.Params.Meta != nil && status == nil {
		p.token = req.Params.Meta.ProgressToken
	}
	go p.loop()
	return p
}

// Output is the runtime's output callback. It copies and returns at once.
func (p *progress) Output(s runtime.Stream, b []byte) {
	i := 0
	if s == runtime.Stderr {
		i = 1
	}
	p.mu.Lock()
	room := progressPending - p.pending[0].Len() - p.pending[1].Len()
	if room < len(b) {
		p.dropped += len(b) - max(room, 0)
		b = b[:max(room, 0)]
	}
	p.pending[i].Write(b)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close sends what is pending and stops the stream; the result follows it.
func (p *progress) Close() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
}

func (p *progress) loop() {
	defer close(p.done)
	last := time.Time{}
	for {
		select {
		case <-p.stop:
			p.flush()
			return
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		// At most one notification per interval: wait out the rest of it.
		if wait := p.interval - time.Since(last); wait > 0 {
			select {
			case <-time.After(wait):
			case <-p.stop:
				p.flush()
				return
			case <-p.ctx.Done():
				return
			}
		}
		p.flush()
		last = time.Now()
	}
}

// flush sends the pending output, stdout then stderr, in chunks.
func (p *progress) flush() {
	p.mu.Lock()
	out, errOut := p.pending[0].String(), p.pending[1].String()
	dropped := p.dropped
	p.pending[0].Reset()
	p.pending[1].Reset()
	p.dropped = 0
	p.mu.Unlock()
	for _, s := range []struct {
		text  string
		name  runtime.Stream
		level mcp.LoggingLevel
	}{{out, runtime.Stdout, mcp.LoggingLevelInfo}, {errOut, runtime.Stderr, mcp.LoggingLevelWarning}} {
		for s.text != "" {
			chunk := cutValid(s.text, progressChunk)
			s.text = s.text[len(chunk):]
			p.send(s.name, s.level, chunk)
		}
	}
	if dropped > 0 {
		p.send(runtime.Stderr, mcp.LoggingLevelWarning, fmt.Sprintf("[airlock: %d bytes of output were not streamed; the result has them up to the cap]\n", dropped))
	}
}

func (p *progress) send(stream runtime.Stream, level mcp.LoggingLevel, text string) {
	p.sent += int64(len(text))
	if p.status != nil {
		p.status(text)
	}
	if p.token != nil {
		_ = p.srv.SendNotificationToClient(p.ctx, string(mcp.MethodNotificationProgress), map[string]any{
			"progressToken": p.token,
			"progress":      p.sent,
			"message":       fmt.Sprintf("[%s %s] %s", p.runID, stream, text),
		})
	}
	if server.ClientSessionFromContext(p.ctx) == nil {
		return
	}
	_ = p.srv.SendLogMessageToClient(p.ctx, mcp.NewLoggingMessageNotification(level, "airlock/"+string(stream), map[string]any{
		"run_id": p.runID, "stream": string(stream), "text": text,
	}))
}

// cutValid returns at most n bytes of s, not splitting a UTF-8 character.
func cutValid(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
