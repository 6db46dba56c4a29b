package approval

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// auditKeep is how many rotated files (path.1 … path.3) are kept; the
// oldest is dropped so the log has a fixed disk budget.
const auditKeep = 3

// Record is one audit line: who asked to run what, who allowed it, and what
// happened. Code is optional because some deployments must not store it;
// CodeSHA256 still ties the record to the exact code.
type Record struct {
	// ID is the call's id; it is the run id when the code ran.
	ID        string    `json:"id"`
	Time      time.Time `json:"time"`
	Client    string    `json:"client"`
	Transport string    `json:"transport"`
	Tool      string    `json:"tool"`
	// Session is the stateful session the call ran in, if any.
	Session string `json:"session,omitempty"`
	// Path is the file a write_file call wrote; for it, the code fields
	// describe the file's content.
	Path       string `json:"path,omitempty"`
	CodeSHA256 string `json:"code_sha256"`
	CodeBytes  int    `json:"code_bytes"`
	Code       string `json:"code,omitempty"`
	// Decision is one of the Decision* constants: auto, approved, denied,
	// expired, cancelled, no_channel, none.
	Decision string `json:"decision"`
	// Rule is the policy rule that let the call through or asked a human.
	Rule     string `json:"rule,omitempty"`
	Approver string `json:"approver"`
	// Channel is how the human was asked: "elicitation", "console", "" for none.
	Channel    string `json:"channel"`
	ApprovalID string `json:"approval_id,omitempty"`
	WaitMS     int64  `json:"wait_ms"`
	Limits     Limits `json:"limits"`
	Network    string `json:"network"`
	// AllowDomains is the allow-list the run had; Granted the part of it a
	// human granted beyond the operator's list.
	AllowDomains []string `json:"allow_domains,omitempty"`
	Granted      []string `json:"granted_domains,omitempty"`
	// EgressDenied lists refused destinations as "host:port (reason)".
	EgressDenied []string `json:"egress_denied"`
	// Outcome is what became of the call: ran, invalid_arguments, not_approved,
	// busy, client_limit, cancelled, infrastructure_error, audit_unavailable.
	Outcome string `json:"outcome"`
	// ExitCode is nil when the code did not run (denied, infrastructure
	// failure), so a denial never reads as exit status 0.
	ExitCode *int `json:"exit_code"`
	// Warm says the run had a sandbox from the warm pool.
	Warm        bool   `json:"warm"`
	DurationMS  int64  `json:"duration_ms"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Truncated   bool   `json:"truncated"`
	LimitHit    string `json:"limit_hit"`
	// LimitsHit are further limits seen hit ("disk": the code filled
	// /workspace or /tmp).
	LimitsHit []string `json:"limits_hit,omitempty"`
	// Error is the message the caller got when the call did not run.
	Error string `json:"error,omitempty"`
}

// Outcomes of a call, as Record.Outcome names them.
const (
	OutcomeRan         = "ran"
	OutcomeInvalid     = "invalid_arguments"
	OutcomeNotApproved = "not_approved"
	OutcomeBusy        = "busy"
	OutcomeClientLimit = "client_limit"
	OutcomeCancelled   = "cancelled"
	OutcomeInfra       = "infrastructure_error"
	// OutcomeCircuitOpen: refused at once while the circuit breaker is open.
	OutcomeCircuitOpen   = "circuit_open"
	OutcomeAuditDisabled = "audit_unavailable"
	// OutcomeFileError: a write_file the sandbox refused (a bad path, a
	// full workspace).
	OutcomeFileError = "file_error"
)

// Audit is an append-only JSON-lines log with size-based rotation. It is
// safe for concurrent use.
type Audit struct {
	mu       sync.Mutex
	path     string
	maxBytes int64
	f        *os.File
	size     int64
	// mirror also gets every line (stdout, for a cluster's log pipeline).
	mirror io.Writer
	// broken is set when a write failed: the next Check reopens the file.
	broken bool
	closed bool
}

// OpenAudit opens (or creates) the log at path. When a write would take the
// file past maxBytes it is rotated to path.1, path.1 to path.2 and so on up
// to path.3; maxBytes <= 0 disables rotation.
func OpenAudit(path string, maxBytes int64) (*Audit, error) {
	a := &Audit{path: path, maxBytes: maxBytes}
	if err := a.openLocked(); err != nil {
		return nil, err
	}
	return a, nil
}

// NewAudit returns a log at path that opens on first use: a server whose
// audit path is not writable yet still starts, refuses to run code, and
// recovers without a restart once the path is fixed.
func NewAudit(path string, maxBytes int64) *Audit {
	return &Audit{path: path, maxBytes: maxBytes}
}

// NewAuditMirrored is NewAudit that also writes every record to mirror
// (airlock's stdout on a cluster, whose log pipeline collects it). With
// path empty, mirror is the only copy.
func NewAuditMirrored(path string, maxBytes int64, mirror io.Writer) *Audit {
	return &Audit{path: path, maxBytes: maxBytes, mirror: mirror}
}

// Path is where the log is written; empty when only mirrored.
func (a *Audit) Path() string { return a.path }

// Check reports whether a record can be written now, opening the file if
// it is not open. Callers run it before starting code, because a record
// that cannot be written afterwards would leave a run unrecorded.
func (a *Audit) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("audit log %s: %w", a.path, os.ErrClosed)
	}
	if a.path == "" {
		return nil
	}
	if a.f == nil || a.broken {
		if a.f != nil {
			_ = a.f.Close()
			a.f = nil
		}
		if err := a.openLocked(); err != nil {
			return err
		}
		a.broken = false
	}
	if err := writable(a.f); err != nil {
		return fmt.Errorf("audit log %s: %w", a.path, err)
	}
	return nil
}

// Write appends rec as one JSON line to the file, fsynced, and to the
// mirror, before returning. The line goes out in a single write under the
// lock so concurrent records never interleave, and a failed file write is
// cut back off, so a record is whole or absent. A caller that gets an
// error must not run the code: an unaudited run is what the log exists to
// prevent.
func (a *Audit) Write(rec Record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("audit record %s: encoding: %w", rec.ID, err)
	}
	line = append(line, '\n')

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("audit record %s: %w", rec.ID, os.ErrClosed)
	}
	if a.path != "" {
		if err := a.appendLocked(rec.ID, line); err != nil {
			return err
		}
	}
	if a.mirror != nil {
		if _, err := a.mirror.Write(line); err != nil {
			return fmt.Errorf("audit record %s: writing to the mirror: %w", rec.ID, err)
		}
	}
	return nil
}

// appendLocked appends line to the file, rotating first when it is full.
func (a *Audit) appendLocked(id string, line []byte) error {
	if a.f == nil {
		if err := a.openLocked(); err != nil {
			return fmt.Errorf("audit record %s: %w", id, err)
		}
	}
	if a.maxBytes > 0 && a.size > 0 && a.size+int64(len(line)) > a.maxBytes {
		if err := a.rotateLocked(); err != nil {
			return fmt.Errorf("audit record %s: %w", id, err)
		}
	}
	n, err := a.f.Write(line)
	if err == nil {
		err = a.f.Sync()
	}
	if err != nil {
		if n > 0 {
			// Drop the partial line so readers never see half a record.
			_ = a.f.Truncate(a.size)
		}
		a.broken = true
		return fmt.Errorf("audit record %s: writing %s: %w", id, a.path, err)
	}
	a.size += int64(n)
	return nil
}

// rotateLocked shifts path.2 → path.3, path.1 → path.2, path → path.1 and
// starts a new file. The current file is only renamed after the older ones
// moved, so a failure leaves every existing record in some file.
func (a *Audit) rotateLocked() error {
	for i := auditKeep - 1; i >= 1; i-- {
		from := fmt.Sprintf("%s.%d", a.path, i)
		to := fmt.Sprintf("%s.%d", a.path, i+1)
		if err := os.Rename(from, to); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotating audit log: %w", err)
		}
	}
	if err := os.Rename(a.path, a.path+".1"); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	old := a.f
	a.f = nil
	if err := old.Close(); err != nil {
		return fmt.Errorf("rotating audit log: closing %s.1: %w", a.path, err)
	}
	if err := a.openLocked(); err != nil {
		return fmt.Errorf("rotating audit log: %w", err)
	}
	// Persist the renames, or a crash could bring back the old name.
	if d, err := os.Open(filepath.Dir(a.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Close flushes and closes the log; later Writes fail.
func (a *Audit) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.f == nil {
		return nil
	}
	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	a.f = nil
	if err != nil {
		return fmt.Errorf("closing audit log %s: %w", a.path, err)
	}
	return nil
}

// openLocked opens the current file and learns its size.
func (a *Audit) openLocked() error {
	if err := os.MkdirAll(filepath.Dir(a.path), 0o700); err != nil {
		return fmt.Errorf("opening audit log %s: %w", a.path, err)
	}
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening audit log: stat %s: %w", a.path, err)
	}
	a.f, a.size = f, st.Size()
	return nil
}
