// Package tools defines airlock's MCP tools: their schemas, their
// descriptions for a model, and handlers that turn a call into a runtime
// request and a runtime result into a tool result.
package tools

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// RunOutput is the structuredContent of run_python and run_shell.
type RunOutput struct {
	RunID           string `json:"run_id" jsonschema:"Identifier of this run in the server's logs"`
	ExitCode        int    `json:"exit_code" jsonschema:"Exit status of the program; 128+N means killed by signal N"`
	Stdout          string `json:"stdout" jsonschema:"Standard output, capped"`
	Stderr          string `json:"stderr" jsonschema:"Standard error, capped"`
	TimedOut        bool   `json:"timed_out" jsonschema:"True when the run hit its timeout and was killed"`
	OOMKilled       bool   `json:"oom_killed" jsonschema:"True when the run ran out of memory"`
	DurationMS      int64  `json:"duration_ms" jsonschema:"Wall-clock time of the run in milliseconds"`
	Truncated       bool   `json:"truncated" jsonschema:"True when stdout or stderr was cut at its cap"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	Reason          string `json:"reason,omitempty" jsonschema:"Why the run did not exit normally: timeout, out_of_memory, output_capped, killed_by_signal, policy_violation, exfiltration_tripwire"`
	// EgressDenied lists network destinations the egress proxy refused, so
	// the caller can correct the code or ask for the domain.
	EgressDenied []DeniedOut `json:"egress_denied" jsonschema:"Network destinations the egress proxy refused during the run"`
	// Attempts are what gVisor saw the code try that sandboxed code has no
	// business doing; absent when there were none.
	Attempts []runtime.Attempt `json:"attempts,omitempty" jsonschema:"What gVisor's runtime monitoring saw the code try that the sandbox refuses or code should not need (mount, namespace, module, ptrace, privilege, kernel, readonly_write, raw_socket, connect_blocked), with the syscall and how often"`
	// Display, Images and Files are what a notebook cell would show
	// besides the output.
	Display       string    `json:"display,omitempty" jsonschema:"The value of the code's last expression, as a notebook shows it (Python; pandas objects as a table)"`
	Images        int       `json:"images,omitempty" jsonschema:"How many matplotlib figures came back as image content"`
	ImagesSkipped int       `json:"images_skipped,omitempty" jsonschema:"Figures left out for the rich.max_images or rich.image_kb caps"`
	Files         []OutFile `json:"files,omitempty" jsonschema:"Files the run wrote or changed under /workspace/out"`
	// FilesTruncated says more files were written than rich.max_files.
	FilesTruncated bool `json:"files_truncated,omitempty"`
	// SessionID names the session the run used; SessionEnded says the
	// session is over (its interpreter died or would not stop).
	SessionID    string `json:"session_id,omitempty"`
	SessionEnded bool   `json:"session_ended,omitempty"`
	// ResumedMS is how long restoring the paused session took first.
	ResumedMS int64 `json:"resumed_ms,omitempty" jsonschema:"The session was paused and this call resumed it first, taking this many milliseconds"`
	// AuditRecord is the hash of the call's audit line, set when it is
	// written.
	AuditRecord string `json:"audit_record,omitempty" jsonschema:"SHA-256 (hex) of this call's line in the server's audit log; airlock audit verify checks the chain it belongs to"`
}

// OutFile is a file a run left under /workspace/out.
type OutFile struct {
	Path     string `json:"path" jsonschema:"Relative to /workspace"`
	Size     int64  `json:"size"`
	Embedded bool   `json:"embedded" jsonschema:"True when its content came back as an embedded resource"`
}

// DeniedOut is one refused destination.
type DeniedOut struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason" jsonschema:"not in allow-list, port not allowed, resolves to private address, SNI mismatch, IP literal not allowed, resolution failed, outside its allow rule, secret_to_wrong_host, secret over plain HTTP, exfiltration_tripwire"`
	// Method and Path name a refused request the proxy could read.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
}

// Handlers serves the run tools from a runtime.Manager.
type Handlers struct {
	Manager runtime.Manager
	Limits  config.Limits
	Log     *slog.Logger
	// Egress is the operator's allow-list; nil when networked runs are not
	// offered. DefaultNetwork is the mode of calls that do not ask.
	Egress         *egress.Policy
	DefaultNetwork string
	// Grantable are domains outside Egress an approver may grant to one
	// call; nil when approval is off or none are configured.
	Grantable *egress.Policy
	// Secrets are what a networked call may ask for by name (the sandbox
	// gets placeholders); nil when none are configured. Tripwires gives
	// every networked run fake credentials that kill it when sent.
	Secrets   *egress.Secrets
	Tripwires bool
	// Gate decides whether a human must approve a run; nil lets every run
	// through, as approval mode off does.
	Gate *approval.Gate
	// Audit records every call; nil when the audit log is disabled.
	Audit *approval.Audit
	// AuditCode puts the code itself in audit records, not only its hash.
	AuditCode bool

	// server sends elicitation requests; set by Register.
	server *server.MCPServer
	// Quotas bound each client's runs; nil: no per-client limits.
	Quotas *Quotas
	// ProgressInterval is the least time between two output notifications
	// of one run; zero means 250 ms.
	ProgressInterval time.Duration

	// Sessions bound stateful sessions (zero Max: none are offered);
	// Files bound the file tools; Rich bounds what a Python run returns
	// besides its output.
	Sessions config.SessionsConfig
	Files    config.FilesConfig
	Rich     config.RichConfig

	// deferred are the records of calls waiting for a client's retry.
	deferredMu sync.Mutex
	deferred   map[string]deferredRecord
	runs       runs
	sessions   sessions
	tasks      taskRegistry

	// Tasks bound the runs clients make tasks of.
	Tasks config.TasksConfig
}

func (h *Handlers) progressInterval() time.Duration {
	if h.ProgressInterval <= 0 {
		return 250 * time.Millisecond
	}
	return h.ProgressInterval
}

// Register adds run_python and run_shell to s.
func (h *Handlers) Register(s *server.MCPServer) {
	h.server = s
	h.registerRunTools(s)
	h.registerSessionTools(s)
	registerApps(s)
	s.AddTool(h.tool("run_python", "code", pythonDescription(h.Limits), "Run Python"), h.taskable(h.handler("run_python", "code", runtime.Python)))
	s.AddTool(h.tool("run_shell", "command", shellDescription(h.Limits), "Run shell command"), h.taskable(h.handler("run_shell", "command", runtime.Shell)))
}

func pythonDescription(l config.Limits) string {
	return fmt.Sprintf(`Run Python 3 code in an isolated gVisor sandbox and return its stdout, stderr and exit code.
Like a notebook cell: the value of a final expression is shown (pandas objects as a table), matplotlib figures shown or left open come back as PNG images, and files written under /workspace/out are listed (small ones attached). Errors come back as a traceback with your line numbers.
Available: the standard library, numpy, pandas, matplotlib.
No network access. The filesystem is read-only except /workspace (the working directory, %d MiB) and /tmp (%d MiB).
Limits: %d s timeout by default (timeout_s, up to %d s), %d MiB memory, %d processes, %d KiB of stdout and of stderr (the rest is dropped).`,
		l.WorkspaceMB, l.TmpMB, l.TimeoutS, l.MaxTimeoutS, l.MemoryMB, l.Pids, l.StdoutBytes/1024)
}

func shellDescription(l config.Limits) string {
	return fmt.Sprintf(`Run a bash command or script in an isolated gVisor sandbox (Debian) and return its stdout, stderr and exit code. Files written under /workspace/out are listed in the result (small ones attached).
Available: coreutils, grep, sed, gawk, findutils, curl, python3. No network access; no root (commands run as an unprivileged user).
The filesystem is read-only except /workspace (the working directory, %d MiB) and /tmp (%d MiB).
Limits: %d s timeout by default (timeout_s, up to %d s), %d MiB memory, %d processes, %d KiB of stdout and of stderr (the rest is dropped).`,
		l.WorkspaceMB, l.TmpMB, l.TimeoutS, l.MaxTimeoutS, l.MemoryMB, l.Pids, l.StdoutBytes/1024)
}

// sessionDescription says what a call without and with session_id keeps.
func (h *Handlers) sessionDescription() string {
	if !h.sessionsEnabled() {
		return "\nEach call starts from a clean sandbox: nothing persists between calls (no variables, no files)."
	}
	return "\nWithout session_id each call starts from a clean sandbox and nothing persists. With the session_id of session_create, Python variables, imports and definitions persist between calls, and /workspace persists for Python and shell alike."
}

func (h *Handlers) networkDescription() string {
	if h.Egress == nil {
		return ""
	}
	d := fmt.Sprintf("\nNetwork: pass network \"allowlist\" to reach these domains (ports %v) through an HTTP(S) proxy the sandbox is configured for: %s. allow_domains narrows that list. Refused destinations come back in egress_denied.",
		h.Egress.Ports(), listOrNone(h.Egress.Domains()))
	if h.Grantable != nil {
		d += fmt.Sprintf(" A human approver may also grant, for one call, domains matching: %s; to ask, call again with them in allow_domains.", listOrNone(h.Grantable.Domains()))
	}
	return d
}

func (h *Handlers) approvalDescription() string {
	if h.Gate == nil || h.Gate.Policy.Mode == approval.ModeOff {
		return ""
	}
	return "\nApproval: a human may have to approve the exact code (and its network and limits) before it runs. If they deny it or do not answer in time, the result says \"Not run\" and why; do not retry the same code unchanged without a reason."
}

func (h *Handlers) tool(name, codeKey, description, title string) mcp.Tool {
	codeDesc := map[string]string{
		"code":    "Python source code to run, as a complete program.",
		"command": "Bash command or script to run.",
	}[codeKey]
	opts := []mcp.ToolOption{
		mcp.WithToolTitle(title),
		// A client may run it as a task (tasks.go) to outlive its own
		// request timeout.
		mcp.WithTaskSupport(mcp.TaskSupportOptional),
		mcp.WithDescription(description + h.sessionDescription() + h.networkDescription() + h.approvalDescription()),
		mcp.WithString(codeKey, mcp.Required(), mcp.Description(codeDesc), mcp.MinLength(1), mcp.MaxLength(h.Limits.CodeBytes)),
		mcp.WithInteger("timeout_s",
			mcp.Description(fmt.Sprintf("Wall-clock limit in seconds (default %d, at most %d). The whole sandbox is killed when it is reached.", h.Limits.TimeoutS, h.Limits.MaxTimeoutS)),
			mcp.Min(1), mcp.Max(float64(h.Limits.MaxTimeoutS))),
	}
	if h.sessionsEnabled() {
		opts = append(opts, mcp.WithString("session_id",
			mcp.Description("Run in this session (from session_create) instead of a fresh sandbox. The session's network was chosen when it was created.")))
	}
	// Network arguments are offered only where a network is: a model should
	// not be shown arguments it cannot use.
	if h.Egress != nil {
		opts = append(opts,
			mcp.WithString("network", mcp.Enum(config.NetworkNone, config.NetworkAllowlist),
				mcp.Description(fmt.Sprintf("none: no network. allowlist: only the operator's allowed domains, through the egress proxy. Default %s.", h.defaultNetwork()))),
			mcp.WithArray("allow_domains", mcp.WithStringItems(),
				mcp.Description("With network allowlist: the domains this run needs, a subset of the operator's list.")))
		if names := h.Secrets.Names(); len(names) > 0 {
			opts = append(opts, mcp.WithArray("secrets", mcp.WithStringEnumItems(names),
				mcp.Description(h.secretsDescription())))
		}
	}
	return withRunApp(mcp.NewTool(name, append(opts,
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[RunOutput](),
		mcp.WithTitleAnnotation(title),
		// The code may do anything inside its sandbox, but the sandbox is
		// thrown away: nothing outside it is changed or read.
		mcp.WithReadOnlyHintAnnotation(false),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(false),
		mcp.WithOpenWorldHintAnnotation(h.Egress != nil),
	)...))
}

// circuitResult answers a call refused because the circuit breaker is open.
func circuitResult(e *runtime.CircuitOpenError) *mcp.CallToolResult {
	return mcp.NewToolResultError(fmt.Sprintf(
		"Not run: the sandbox runtime has been failing to start sandboxes (last failure: %s), so airlock stops trying for a while (circuit breaker). Retry in %d s. This is a problem on the server, not in your code: the operator should run `airlock doctor` on the server host.",
		e.Reason, int(e.RetryIn.Round(time.Second)/time.Second)))
}

func infraResult(op string) *mcp.CallToolResult {
	return mcp.NewToolResultError(fmt.Sprintf("The sandbox runtime failed (%s). This is a problem on the server, not in your code: the operator should run `airlock doctor` on the server host; details are in the server log.", op))
}

func (h *Handlers) result(tool string, r runtime.Result, err error) *mcp.CallToolResult {
	if err != nil {
		var ie *runtime.InfraError
		var co *runtime.CircuitOpenError
		switch {
		case errors.As(err, &co):
			return circuitResult(co)
		case errors.Is(err, runtime.ErrRuntimeRestarted):
			h.Log.Error("run ended by a sandbox runtime restart", "tool", tool, "run", r.RunID, "err", err)
			return mcp.NewToolResultError("Not completed: the sandbox runtime (containerd) went away during this call. An embedded containerd is restarted by airlock within seconds, and what the call left is removed; retry it.")
		case errors.Is(err, runtime.ErrSessionBusy):
			return mcp.NewToolResultError("The session is busy with another call; retry when it has finished (a session runs one call at a time).")
		case errors.Is(err, runtime.ErrSessionClosed):
			return mcp.NewToolResultError(fmt.Sprintf("The session has ended (%v); start another with session_create.", err))
		case errors.Is(err, runtime.ErrBusy):
			return mcp.NewToolResultError(fmt.Sprintf("All %d sandboxes are busy (limits.concurrency); retry in a few seconds.", h.Limits.Concurrency))
		case errors.Is(err, errShuttingDown):
			return mcp.NewToolResultError("The server is shutting down; the run was cancelled and its sandbox killed. Retry in a moment.")
		case errors.Is(err, errTaskExpired):
			return mcp.NewToolResultError("Not completed: the ttl asked for this task passed before the run ended; its sandbox was killed. Ask for a longer ttl, or none.")
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return mcp.NewToolResultError("The call was cancelled; its sandbox was killed.")
		case errors.As(err, &ie):
			h.Log.Error("sandbox runtime failed", "tool", tool, "run", r.RunID, "op", ie.Op, "err", ie.Err)
			return infraResult(ie.Op)
		default:
			h.Log.Error("run failed", "tool", tool, "run", r.RunID, "err", err)
			return infraResult("run")
		}
	}
	out := ToOutput(r)
	res := structured(out, RenderText(out))
	res.IsError = r.Failed()
	res.Content = append(res.Content, richContent(r.Rich)...)
	return res
}

// richContent is a run's figures as image content and its small out/
// files as embedded resources.
func richContent(r *driver.Rich) []mcp.Content {
	if r == nil {
		return nil
	}
	var out []mcp.Content
	for _, img := range r.Images {
		out = append(out, mcp.NewImageContent(base64.StdEncoding.EncodeToString(img), "image/png"))
	}
	for _, f := range r.Files {
		if f.Content == nil && f.Size != 0 {
			continue
		}
		uri := "file://" + driver.Workspace + "/" + f.Path
		mimeType := mime.TypeByExtension(path.Ext(f.Path))
		if utf8.Valid(f.Content) {
			if mimeType == "" {
				mimeType = "text/plain"
			}
			out = append(out, mcp.NewEmbeddedResource(mcp.TextResourceContents{URI: uri, MIMEType: mimeType, Text: string(f.Content)}))
		} else {
			if mimeType == "" {
				mimeType = "application/octet-stream"
			}
			out = append(out, mcp.NewEmbeddedResource(mcp.BlobResourceContents{URI: uri, MIMEType: mimeType, Blob: base64.StdEncoding.EncodeToString(f.Content)}))
		}
	}
	return out
}

// ToOutput converts a runtime result to the tool's structured output.
func ToOutput(r runtime.Result) RunOutput {
	o := RunOutput{
		RunID:           r.RunID,
		ExitCode:        r.ExitCode,
		Stdout:          r.Stdout,
		Stderr:          r.Stderr,
		TimedOut:        r.TimedOut,
		OOMKilled:       r.OOMKilled,
		DurationMS:      r.Duration.Milliseconds(),
		Truncated:       r.Truncated(),
		StdoutTruncated: r.StdoutTruncated,
		StderrTruncated: r.StderrTruncated,
		Reason:          r.Reason,
		EgressDenied:    denied(r.EgressDenied),
		Attempts:        r.Attempts,
		SessionEnded:    r.SessionLost,
		ResumedMS:       r.Resumed.Milliseconds(),
	}
	if rich := r.Rich; rich != nil {
		o.Display, o.Images, o.ImagesSkipped, o.FilesTruncated = rich.Display, len(rich.Images), rich.ImagesSkipped, rich.FilesTruncated
		for _, f := range rich.Files {
			o.Files = append(o.Files, OutFile{Path: f.Path, Size: f.Size, Embedded: f.Content != nil || f.Size == 0})
		}
	}
	return o
}

func denied(ds []egress.Denial) []DeniedOut {
	out := make([]DeniedOut, 0, len(ds))
	for _, d := range ds {
		out = append(out, DeniedOut{Host: d.Host, Port: d.Port, Reason: d.Reason, Method: d.Method, Path: d.Path})
	}
	return out
}

// RenderText is the human-readable form of a run result.
func RenderText(o RunOutput) string {
	var b strings.Builder
	switch {
	case o.TimedOut:
		fmt.Fprintf(&b, "Timed out after %d ms: the sandbox was killed.\n", o.DurationMS)
	case o.OOMKilled:
		fmt.Fprintf(&b, "Out of memory: the sandbox was killed (exit code %d, %d ms).\n", o.ExitCode, o.DurationMS)
	case o.Reason == egress.ReasonTripwire:
		fmt.Fprintf(&b, "Killed: exfiltration_tripwire. The code sent a fake credential planted in its sandbox to %s; the sandbox was killed at once (%d ms).\n", tripDestination(o.EgressDenied), o.DurationMS)
	default:
		fmt.Fprintf(&b, "Exit code %d (%d ms).\n", o.ExitCode, o.DurationMS)
	}
	if o.ResumedMS > 0 {
		fmt.Fprintf(&b, "The session was paused; this call resumed it first (%d ms).\n", o.ResumedMS)
	}
	if o.Truncated {
		b.WriteString("Output was cut at its cap; the rest was dropped.\n")
	}
	if o.Stdout != "" {
		b.WriteString("--- stdout ---\n" + o.Stdout)
		if !strings.HasSuffix(o.Stdout, "\n") {
			b.WriteString("\n")
		}
	}
	if o.Stderr != "" {
		b.WriteString("--- stderr ---\n" + o.Stderr)
		if !strings.HasSuffix(o.Stderr, "\n") {
			b.WriteString("\n")
		}
	}
	if o.Display != "" {
		b.WriteString("--- value ---\n" + o.Display)
		if !strings.HasSuffix(o.Display, "\n") {
			b.WriteString("\n")
		}
	}
	if o.Stdout == "" && o.Stderr == "" && o.Display == "" && o.Images == 0 && len(o.Files) == 0 {
		b.WriteString("(no output)\n")
	}
	if o.Images > 0 {
		fmt.Fprintf(&b, "--- %d figure(s), returned as images ---\n", o.Images)
	}
	if o.ImagesSkipped > 0 {
		fmt.Fprintf(&b, "%d figure(s) left out: over rich.max_images or rich.image_kb.\n", o.ImagesSkipped)
	}
	if len(o.Files) > 0 {
		b.WriteString("--- files written under /workspace/out ---\n")
		for _, f := range o.Files {
			note := ""
			if f.Embedded {
				note = " (content attached)"
			}
			fmt.Fprintf(&b, "%s %d bytes%s\n", f.Path, f.Size, note)
		}
		if o.FilesTruncated {
			b.WriteString("(more files not listed: rich.max_files)\n")
		}
	}
	if o.SessionEnded {
		fmt.Fprintf(&b, "The session %s has ended: its interpreter died or would not stop, and its state and files are gone. Start another with session_create.\n", o.SessionID)
	}
	if len(o.Attempts) > 0 {
		parts := make([]string, 0, len(o.Attempts))
		for _, a := range o.Attempts {
			parts = append(parts, fmt.Sprintf("%s (%s) x%d", a.Kind, a.Syscall, a.Count))
		}
		fmt.Fprintf(&b, "gVisor saw the code try: %s\n", strings.Join(parts, ", "))
	}
	if len(o.EgressDenied) > 0 {
		b.WriteString("--- network destinations refused ---\n")
		for _, d := range o.EgressDenied {
			fmt.Fprintf(&b, "%s: %s\n", deniedWhere(d.Host, d.Port, d.Method, d.Path), d.Reason)
		}
	}
	return b.String()
}

// tripDestination names where a tripwire went, from the run's denials.
func tripDestination(ds []DeniedOut) string {
	for _, d := range ds {
		if d.Reason == egress.ReasonTripwire {
			return fmt.Sprintf("%s:%d", d.Host, d.Port)
		}
	}
	return "the network"
}

// deniedWhere renders a refused destination, with the request when the
// proxy could read it: "api.test:443 POST /v1".
func deniedWhere(host string, port int, method, path string) string {
	w := fmt.Sprintf("%s:%d", host, port)
	if method != "" {
		w += " " + method + " " + path
	}
	return w
}
