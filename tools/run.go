// Package tools defines airlock's MCP tools: their schemas, their
// descriptions for a model, and handlers that turn a call into a runtime
// request and a runtime result into a tool result.
package tools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/boot"
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
	Reason          string `json:"reason,omitempty" jsonschema:"Why the run did not exit normally: timeout, out_of_memory, output_capped, killed_by_signal"`
	// EgressDenied lists network destinations the egress proxy refused, so
	// the caller can correct the code or ask for the domain.
	EgressDenied []DeniedOut `json:"egress_denied" jsonschema:"Network destinations the egress proxy refused during the run"`
}

// DeniedOut is one refused destination.
type DeniedOut struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason" jsonschema:"not in allow-list, port not allowed, resolves to private address, SNI mismatch, IP literal not allowed, resolution failed"`
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

	// deferred are the records of calls waiting for a client's retry.
	deferredMu sync.Mutex
	deferred   map[string]deferredRecord
	runs       runs
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
	s.AddTool(h.tool("run_python", "code", pythonDescription(h.Limits), "Run Python"), h.handler("run_python", "code", runtime.Python))
	s.AddTool(h.tool("run_shell", "command", shellDescription(h.Limits), "Run shell command"), h.handler("run_shell", "command", runtime.Shell))
}

func pythonDescription(l config.Limits) string {
	return fmt.Sprintf(`Run Python 3 code in a fresh, isolated gVisor sandbox and return its stdout, stderr and exit code.
Each call starts from a clean sandbox: nothing persists between calls (no variables, no files).
Print what you want to see; the value of the last expression is not shown.
Available: the standard library, numpy, pandas, matplotlib (Agg backend; save figures to files).
No network access. The filesystem is read-only except /workspace (the working directory, %d MiB) and /tmp (%d MiB).
Limits: %d s timeout by default (timeout_s, up to %d s), %d MiB memory, %d processes, %d KiB of stdout and of stderr (the rest is dropped).`,
		l.WorkspaceMB, l.TmpMB, l.TimeoutS, l.MaxTimeoutS, l.MemoryMB, l.Pids, l.StdoutBytes/1024)
}

func shellDescription(l config.Limits) string {
	return fmt.Sprintf(`Run a bash command or script in a fresh, isolated gVisor sandbox (Debian) and return its stdout, stderr and exit code.
Each call starts from a clean sandbox: nothing persists between calls.
Available: coreutils, grep, sed, gawk, findutils, curl, python3. No network access; no root (commands run as an unprivileged user).
The filesystem is read-only except /workspace (the working directory, %d MiB) and /tmp (%d MiB).
Limits: %d s timeout by default (timeout_s, up to %d s), %d MiB memory, %d processes, %d KiB of stdout and of stderr (the rest is dropped).`,
		l.WorkspaceMB, l.TmpMB, l.TimeoutS, l.MaxTimeoutS, l.MemoryMB, l.Pids, l.StdoutBytes/1024)
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
		mcp.WithDescription(description + h.networkDescription() + h.approvalDescription()),
		mcp.WithString(codeKey, mcp.Required(), mcp.Description(codeDesc), mcp.MinLength(1), mcp.MaxLength(h.Limits.CodeBytes)),
		mcp.WithInteger("timeout_s",
			mcp.Description(fmt.Sprintf("Wall-clock limit in seconds (default %d, at most %d). The whole sandbox is killed when it is reached.", h.Limits.TimeoutS, h.Limits.MaxTimeoutS)),
			mcp.Min(1), mcp.Max(float64(h.Limits.MaxTimeoutS))),
	}
	// Network arguments are offered only where a network is: a model should
	// not be shown arguments it cannot use.
	if h.Egress != nil {
		opts = append(opts,
			mcp.WithString("network", mcp.Enum(config.NetworkNone, config.NetworkAllowlist),
				mcp.Description(fmt.Sprintf("none: no network. allowlist: only the operator's allowed domains, through the egress proxy. Default %s.", h.defaultNetwork()))),
			mcp.WithArray("allow_domains", mcp.WithStringItems(),
				mcp.Description("With network allowlist: the domains this run needs, a subset of the operator's list.")))
	}
	return mcp.NewTool(name, append(opts,
		mcp.WithSchemaAdditionalProperties(false),
		mcp.WithOutputSchema[RunOutput](),
		mcp.WithTitleAnnotation(title),
		// The code may do anything inside its sandbox, but the sandbox is
		// thrown away: nothing outside it is changed or read.
		mcp.WithReadOnlyHintAnnotation(false),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(false),
		mcp.WithOpenWorldHintAnnotation(h.Egress != nil),
	)...)
}

// RuntimeLimits turns configured limits (and a call's timeout, 0 for the
// default) into the runtime's.
func RuntimeLimits(l config.Limits, timeoutS int) runtime.Limits { return boot.RunLimits(l, timeoutS) }

func infraResult(op string) *mcp.CallToolResult {
	return mcp.NewToolResultError(fmt.Sprintf("The sandbox runtime failed (%s). This is a problem on the server, not in your code: the operator should run `airlock doctor` on the server host; details are in the server log.", op))
}

func (h *Handlers) result(tool string, r runtime.Result, err error) *mcp.CallToolResult {
	if err != nil {
		var ie *runtime.InfraError
		switch {
		case errors.Is(err, runtime.ErrBusy):
			return mcp.NewToolResultError(fmt.Sprintf("All %d sandboxes are busy (limits.concurrency); retry in a few seconds.", h.Limits.Concurrency))
		case errors.Is(err, errShuttingDown):
			return mcp.NewToolResultError("The server is shutting down; the run was cancelled and its sandbox killed. Retry in a moment.")
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
	res := mcp.NewToolResultStructured(out, RenderText(out))
	res.IsError = r.Failed()
	return res
}

// ToOutput converts a runtime result to the tool's structured output.
func ToOutput(r runtime.Result) RunOutput {
	return RunOutput{
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
	}
}

func denied(ds []egress.Denial) []DeniedOut {
	out := make([]DeniedOut, 0, len(ds))
	for _, d := range ds {
		out = append(out, DeniedOut{Host: d.Host, Port: d.Port, Reason: d.Reason})
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
	default:
		fmt.Fprintf(&b, "Exit code %d (%d ms).\n", o.ExitCode, o.DurationMS)
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
	if o.Stdout == "" && o.Stderr == "" {
		b.WriteString("(no output)\n")
	}
	if len(o.EgressDenied) > 0 {
		b.WriteString("--- network destinations refused ---\n")
		for _, d := range o.EgressDenied {
			fmt.Fprintf(&b, "%s:%d: %s\n", d.Host, d.Port, d.Reason)
		}
	}
	return b.String()
}
