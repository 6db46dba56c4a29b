// Package runtime is the backend-neutral face of airlock's sandboxes: the
// Manager and Session interfaces, Request, Result and Limits, admission,
// the circuit breaker and the sandbox policy both backends build from.
// The backends (backend/local: containerd on this host; a Kubernetes one)
// implement it. It is a plain Go library: it knows nothing of MCP,
// containerd or Kubernetes.
package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Language says which interpreter runs a request's code.
type Language string

// The languages a sandbox runs.
const (
	Python Language = "python"
	Shell  Language = "shell"
)

// Limits bound one run. Zero values are not valid: callers fill every field,
// usually from the server's configuration.
type Limits struct {
	Timeout        time.Duration
	MemoryBytes    int64
	CPUs           float64
	Pids           int64
	StdoutBytes    int
	StderrBytes    int
	WorkspaceBytes int64
	TmpBytes       int64
}

// SameSandbox reports whether a sandbox made with limits l serves a run
// with limits o: the limits built into a sandbox must be equal; the
// timeout and output caps are the host's business and may differ.
func (l Limits) SameSandbox(o Limits) bool {
	return l.MemoryBytes == o.MemoryBytes && l.CPUs == o.CPUs && l.Pids == o.Pids &&
		l.WorkspaceBytes == o.WorkspaceBytes && l.TmpBytes == o.TmpBytes
}

// Request is one piece of code to run in a fresh sandbox.
type Request struct {
	// RunID names the run in logs and container labels; the manager makes one when empty.
	RunID    string
	Language Language
	Code     string
	Limits   Limits
	// Egress, when set, gives the run a network that reaches only the
	// policy's names through the egress proxy. Nil: loopback only.
	Egress *egress.Policy
	// Trace asks for Result.Timings (profiling; the benchmark uses it).
	Trace bool
	// Rich bounds what a Python run may return besides its output (zero:
	// the driver's defaults).
	Rich driver.RichCaps
	// Env are extra variables for this run only, overlaid on the
	// sandbox's environment. A sandbox's own environment is fixed when it
	// boots, before a pooled one knows its run: these go with the work
	// instead. Names must not be ones airlock sets itself (CheckOverlay).
	// In a session, the Python interpreter keeps what a call set for the
	// calls after it, as it keeps whatever the code sets in os.environ.
	Env map[string]string
	// HomeFiles are files written into the code user's home, /workspace,
	// mode 0600, owned by the code's user, before the code runs; each
	// replaces a file of its name. Names are base names, such as ".netrc".
	HomeFiles map[string]string
	// Output, when set, is called with each chunk of output as it arrives,
	// within the caps. It runs on the output copier and must not block; the
	// slice is valid only during the call.
	Output func(Stream, []byte)
}

// Stream names an output stream of a run.
type Stream string

// The two output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Reasons a run did not end with a normal exit.
const (
	ReasonTimeout      = "timeout"
	ReasonOutOfMemory  = "out_of_memory"
	ReasonOutputCapped = "output_capped"
	ReasonSignal       = "killed_by_signal"
	// ReasonTripwire: a fake credential planted in the sandbox crossed
	// the egress proxy, and the run was killed (egress.ReasonTripwire).
	ReasonTripwire = egress.ReasonTripwire
)

// Result is what came back from a run. A non-zero exit is a Result, not an error.
type Result struct {
	RunID           string
	ExitCode        int
	Stdout          string
	Stderr          string
	StdoutTruncated bool
	StderrTruncated bool
	TimedOut        bool
	OOMKilled       bool
	Duration        time.Duration
	// Reason is empty for a normal exit, else one of the Reason constants.
	Reason string
	// LimitsHit are limits seen hit from inside the sandbox besides
	// Reason's: driver.LimitDisk when the code filled a filesystem.
	LimitsHit []string
	// EgressDenied lists the destinations the egress proxy refused.
	EgressDenied []egress.Denial
	// Attempts are what gVisor's runtime monitoring saw the code try
	// (mounts, module loads, ptrace, ...), when it is on.
	Attempts []Attempt
	// Warm says the run used a pooled sandbox.
	Warm bool
	// Rich is what a Python run showed besides its output: the value of a
	// final expression, figures, files left under /workspace/out.
	Rich *driver.Rich
	// SessionLost says a session's sandbox or interpreter is gone: the
	// session is over.
	SessionLost bool
	// Resumed is how long restoring a paused session took before this
	// call ran; 0 when it was running.
	Resumed time.Duration
	// Timings are milliseconds from the start of Run to each step, with the
	// driver's own steps under "driver.", when Request.Trace asked.
	Timings map[string]float64
}

// Truncated reports whether any output was dropped at its cap.
func (r Result) Truncated() bool { return r.StdoutTruncated || r.StderrTruncated }

// Failed reports whether the user's code failed: non-zero exit, timeout or OOM.
func (r Result) Failed() bool { return r.ExitCode != 0 || r.TimedOut || r.OOMKilled }

// Manager runs requests. Implementations are safe for concurrent use.
type Manager interface {
	// Run executes req in a new sandbox and destroys it afterwards. The error
	// is non-nil only for infrastructure faults (and ErrBusy); failures of
	// the user's code are reported in the Result.
	Run(ctx context.Context, req Request) (Result, error)
	// Close destroys every sandbox this manager still owns.
	Close(ctx context.Context) error
}

// Session is one sandbox kept for many calls: a Python interpreter whose
// state persists between calls and a /workspace shared by Python and shell.
type Session interface {
	ID() string
	// Run runs one call; Result.SessionLost says the session ended with it.
	Run(ctx context.Context, req Request) (Result, error)
	// File does one file operation in /workspace, inside the sandbox.
	File(ctx context.Context, op driver.FileOp) (driver.FileResult, error)
	// Lost reports whether the session ended on its own.
	Lost() bool
	// Close destroys the session's sandbox.
	Close()
}

// SessionOptions make a session.
type SessionOptions struct {
	// ID names the session; its sandbox is labelled with it.
	ID string
	// Limits are the sandbox's; each call's timeout is its own.
	Limits Limits
	// Egress, when set, is the session's network for its whole life.
	Egress *egress.Policy
	// Owner is the client the session belongs to. A backend whose sessions
	// outlive this process (SessionAdopter) records it, and hands the
	// session to another process for that client only.
	Owner string
	// Idle and Lifetime end the session: after Idle without a call, and
	// Lifetime after it began. A backend whose sessions outlive this
	// process ends them by these when no process serves them.
	Idle, Lifetime time.Duration
	// Env and HomeFiles are given to every call of the session, as
	// Request's are, under the call's own (OverlayRequest). They live in
	// this process only: a session adopted from another (SessionAdopter)
	// has none unless its calls bring them.
	Env       map[string]string
	HomeFiles map[string]string
}

// SessionRecord is what a backend kept of a session it hands over.
type SessionRecord struct {
	Owner   string
	Created time.Time
	Idle    time.Duration
	// LastUsed is the session's last call; zero when unknown.
	LastUsed time.Time
	Calls    int
	// Egress is a networked session's allow-list; nil for none.
	Egress *egress.Policy
}

// SessionAdopter is a SessionManager whose sessions outlive the process
// that opened them: another airlock with the same backend serves them.
type SessionAdopter interface {
	SessionManager
	// AdoptSession takes over session id, when it exists and belongs to
	// owner; otherwise ErrNoSession, and nothing was touched.
	AdoptSession(ctx context.Context, id, owner string) (Session, SessionRecord, error)
}

// SessionLister is a SessionAdopter that can list the sessions another
// process left for an owner (paused ones, locally).
type SessionLister interface {
	SessionAdopter
	// LeftSessions are the ids of owner's sessions no process serves.
	LeftSessions(owner string) []string
}

// SessionReleaser is a Session that can outlive this process. Release,
// at shutdown, ends this process's hold on it: the sandbox is kept, with
// its state, for another process to adopt at the client's next call when
// one can, and destroyed (as Close) when none can.
type SessionReleaser interface {
	Session
	Release()
}

// SessionPauser is a Session that can be paused: its sandbox checkpointed
// to disk and destroyed, so it holds no memory while idle, and restored at
// its next call (Result.Resumed).
type SessionPauser interface {
	Session
	// Pause checkpoints the session; ErrSessionBusy while a call runs.
	Pause(ctx context.Context) error
	// Paused reports whether the session is on disk now.
	Paused() bool
}

// PauseCapable is a Manager whose sessions may pause and fork
// (SessionPauser, SessionForker).
type PauseCapable interface {
	PausesSessions() bool
}

// SessionForker is a Session that can be copied into a new session.
type SessionForker interface {
	Session
	// Fork makes session o.ID with this one's variables and /workspace
	// (o.Limits are this one's); the two are independent from then on.
	Fork(ctx context.Context, o SessionOptions) (Session, error)
}

// ErrNoSession is returned by AdoptSession for a session that does not
// exist, has ended, or belongs to another client.
var ErrNoSession = errors.New("no such session")

// SessionManager is a Manager that can keep sessions.
type SessionManager interface {
	Manager
	OpenSession(ctx context.Context, o SessionOptions) (Session, error)
}

// ErrSessionBusy is returned when a session is already serving a call.
var ErrSessionBusy = errors.New("the session is busy with another call")

// ErrSessionClosed is returned for a session that has ended.
var ErrSessionClosed = errors.New("the session has ended")

// ErrRuntimeRestarted is wrapped in the error of a run that failed while
// the backend's sandbox runtime (containerd locally) was down and being
// restarted.
var ErrRuntimeRestarted = errors.New("the sandbox runtime (containerd) went away during the call")

// ErrBusy is returned when the concurrency limit is reached.
var ErrBusy = errors.New("all sandboxes are busy")

// InfraError is an infrastructure fault: containerd, runsc or the image failed.
// Its message is short and safe to show a user; Err holds the detail for logs.
type InfraError struct {
	Op  string
	Err error
}

func (e *InfraError) Error() string { return fmt.Sprintf("%s: %v", e.Op, e.Err) }
func (e *InfraError) Unwrap() error { return e.Err }

// Infra wraps err as an InfraError of operation op.
func Infra(op string, err error) error { return &InfraError{Op: op, Err: err} }

// NewRunID returns a random run id.
func NewRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Millis is d in milliseconds, as Result.Timings holds it.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
