package approval

import (
	"crypto/ed25519"
	"encoding/base64"
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
	// Seq and Prev chain the record into the log: its place, and the hash
	// of the line before it. Audit.Write sets them.
	Seq  uint64 `json:"seq"`
	Prev string `json:"prev"`
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
	// Secrets names the secrets the run was given (never their values);
	// Tripwires says it carried fake credentials.
	Secrets   []string `json:"secrets,omitempty"`
	Tripwires bool     `json:"tripwires,omitempty"`
	// EgressDenied lists refused destinations as "host:port (reason)".
	EgressDenied []string `json:"egress_denied"`
	// Attempts are what gVisor's runtime monitoring saw the code try, as
	// "kind syscall xN".
	Attempts []string `json:"attempts,omitempty"`
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

// Audit is an append-only JSON-lines log with size-based rotation, whose
// lines form a hash chain (see auditchain.go) sealed with an Ed25519 key.
// It is safe for concurrent use.
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

	keyFile, headFile string
	sealEvery         int
	key               ed25519.PrivateKey
	// chained says seq and last hold the chain's state: the next line's
	// seq and the hash of the line before it. sinceMark counts records
	// since the last seal or genesis.
	chained   bool
	seq       uint64
	last      string
	sinceMark uint64
}

// AuditOptions configure NewAuditWith.
type AuditOptions struct {
	// Path is the log file; empty when Mirror is the only copy.
	Path string
	// MaxBytes is the size at which the file rotates; <= 0 never.
	MaxBytes int64
	// Mirror also gets every line.
	Mirror io.Writer
	// KeyFile is the Ed25519 key that signs seals, made on first use;
	// empty: no seals.
	KeyFile string
	// HeadFile keeps the chain head, so a log cut at its end is seen;
	// empty: none.
	HeadFile string
	// SealEvery writes a seal after this many records; 0: only at Close.
	SealEvery int
}

// NewAuditWith returns a log that opens on first use (see NewAudit).
func NewAuditWith(o AuditOptions) *Audit {
	return &Audit{path: o.Path, maxBytes: o.MaxBytes, mirror: o.Mirror, keyFile: o.KeyFile, headFile: o.HeadFile, sealEvery: o.SealEvery}
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
		return a.chainLocked()
	}
	unlock, err := a.lockLocked()
	if err != nil {
		return err
	}
	defer unlock()
	if a.f == nil || a.broken {
		if a.f != nil {
			_ = a.f.Close()
			a.f = nil
		}
		if err := a.openLocked(); err != nil {
			return err
		}
		// Learn the chain again from the file: a failed write may have
		// left it otherwise than this process thinks.
		a.broken, a.chained = false, false
	}
	if err := writable(a.f); err != nil {
		return fmt.Errorf("audit log %s: %w", a.path, err)
	}
	a.followLocked()
	return a.chainLocked()
}

// lockLocked takes the log's file lock (path.lock), which every airlock
// writing the log holds from reading the chain's end to writing its line.
func (a *Audit) lockLocked() (func(), error) {
	if a.path == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(a.path), 0o700); err != nil {
		return nil, fmt.Errorf("audit lock: %w", err)
	}
	return lockAuditFile(a.path + ".lock")
}

// followLocked notices, under the file lock, that another airlock sharing
// the log wrote to it or rotated it since this one last did: the chain is
// then learnt again from the file (chainLocked), reopened if it moved.
func (a *Audit) followLocked() {
	if a.path == "" || a.f == nil || !a.chained {
		return
	}
	st, err := os.Stat(a.path)
	fst, ferr := a.f.Stat()
	if err == nil && ferr == nil && os.SameFile(st, fst) && st.Size() == a.size {
		return
	}
	if err != nil || ferr != nil || !os.SameFile(st, fst) {
		_ = a.f.Close()
		a.f = nil
	}
	a.chained = false
}

// Write appends rec as one JSON line to the file, fsynced, and to the
// mirror, before returning, chained to the line before; it returns the
// line's hash, which the caller hands to the client as proof of the record.
// The line goes out in a single write under the lock so concurrent records
// never interleave, and a failed file write is cut back off, so a record is
// whole or absent. A caller that gets an error must not run the code: an
// unaudited run is what the log exists to prevent.
func (a *Audit) Write(rec Record) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return "", fmt.Errorf("audit record %s: %w", rec.ID, os.ErrClosed)
	}
	unlock, err := a.lockLocked()
	if err != nil {
		return "", fmt.Errorf("audit record %s: %w", rec.ID, err)
	}
	defer unlock()
	a.followLocked()
	if err := a.chainLocked(); err != nil {
		return "", fmt.Errorf("audit record %s: %w", rec.ID, err)
	}
	rec.Seq, rec.Prev = a.seq, a.last
	line, err := json.Marshal(rec)
	if err != nil {
		return "", fmt.Errorf("audit record %s: encoding: %w", rec.ID, err)
	}
	hash, err := a.emitLocked(rec.ID, line)
	if err != nil {
		return hash, err
	}
	a.sinceMark++
	if a.key != nil && a.sealEvery > 0 && a.sinceMark >= uint64(a.sealEvery) {
		if err := a.markLocked(KindSeal); err != nil {
			return hash, fmt.Errorf("audit record %s written, but not the seal after it: %w", rec.ID, err)
		}
	}
	return hash, nil
}

// emitLocked writes one chain line to the file and the mirror and moves
// the chain on. The chain follows the file (or the mirror, when it is the
// only copy): once the line is there, the next line must link to it, even
// if the mirror then fails.
func (a *Audit) emitLocked(id string, line []byte) (string, error) {
	hash := LineHash(line)
	full := append(line, '\n')
	if a.path != "" {
		if err := a.appendLocked(id, full); err != nil {
			return "", err
		}
		a.seq, a.last = a.seq+1, hash
	}
	if a.mirror != nil {
		if _, err := a.mirror.Write(full); err != nil {
			return "", fmt.Errorf("audit record %s: writing to the mirror: %w", id, err)
		}
		if a.path == "" {
			a.seq, a.last = a.seq+1, hash
		}
	}
	if err := a.writeHeadLocked(); err != nil {
		return hash, fmt.Errorf("audit record %s written, but not the chain head: %w", id, err)
	}
	return hash, nil
}

// chainLocked learns the chain's state once: it loads (or makes) the key,
// then resumes from the last line of the newest non-empty file, or starts a
// new chain with a genesis line when there is none (and at every start
// when the mirror is the only copy).
func (a *Audit) chainLocked() error {
	if a.chained {
		return nil
	}
	if a.keyFile != "" && a.key == nil {
		k, err := LoadAuditKey(a.keyFile, true, true)
		if err != nil {
			return err
		}
		a.key = k
	}
	if a.path != "" {
		if a.f == nil {
			if err := a.openLocked(); err != nil {
				return err
			}
		}
		resumed, err := a.resumeLocked()
		if err != nil {
			return err
		}
		if resumed {
			a.chained = true
			return nil
		}
	}
	a.seq, a.last, a.sinceMark = 0, "", 0
	if err := a.markLocked(KindGenesis); err != nil {
		return err
	}
	a.chained = true
	return nil
}

// resumeLocked continues the chain from the last line on disk; false when
// there is none to continue (no file, or only an older airlock's lines).
// A log that ends before the head says it did was cut while airlock was
// stopped: it is refused, because the next write would hide that.
func (a *Audit) resumeLocked() (bool, error) {
	files := AuditFiles(a.path)
	newestFirst := make([]string, len(files))
	for i, p := range files {
		newestFirst[len(files)-1-i] = p
	}
	head, err := a.readHead()
	if err != nil {
		return false, err
	}
	for i, p := range newestFirst {
		line, err := lastLine(p)
		if err != nil {
			return false, fmt.Errorf("resuming the audit chain from %s: %w; run `airlock audit verify`, and move the damaged file aside to go on", p, err)
		}
		if line == nil {
			continue
		}
		var l chainLine
		if err := json.Unmarshal(line, &l); err != nil {
			return false, fmt.Errorf("resuming the audit chain from %s: its last line is not JSON (%v); run `airlock audit verify`, and move the damaged file aside to go on", p, err)
		}
		if l.Seq == nil || l.Prev == nil {
			break // an older airlock's log: a new chain starts after it
		}
		seq, hash := *l.Seq, LineHash(line)
		if head != nil && (head.Seq > seq || head.Seq == seq && head.Hash != hash) {
			return false, a.cutError(head, fmt.Sprintf("ends at seq %d", seq))
		}
		if head != nil && seq > head.Seq+1 {
			return false, fmt.Errorf("audit log %s ends at seq %d, but its head %s says seq %d: lines were appended while airlock was stopped. Run `airlock audit verify`; to start a new chain, keep the files as evidence and move them and %s aside",
				a.path, seq, a.headFile, head.Seq, a.headFile)
		}
		a.seq, a.last, a.sinceMark = seq+1, hash, 0
		if l.Kind == "" {
			n, err := linesSinceMark(newestFirst[i:])
			if err != nil {
				return false, fmt.Errorf("resuming the audit chain from %s: %w", p, err)
			}
			a.sinceMark = n
		}
		return true, nil
	}
	if head != nil {
		return false, a.cutError(head, "has no chain left")
	}
	return false, nil
}

func (a *Audit) cutError(h *auditHead, what string) error {
	return fmt.Errorf("audit log %s %s, but its head %s says it reached seq %d: records were removed or changed while airlock was stopped. Run `airlock audit verify`; to start a new chain, keep the files as evidence and move them and %s aside",
		a.path, what, a.headFile, h.Seq, a.headFile)
}

// readHead is the head file when it is this log's; nil otherwise.
func (a *Audit) readHead() (*auditHead, error) {
	if a.headFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(a.headFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit head: %w", err)
	}
	var h auditHead
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("audit head %s is not JSON (%v): move it aside once `airlock audit verify` has looked at it", a.headFile, err)
	}
	if h.Path != a.path {
		return nil, nil
	}
	return &h, nil
}

// writeHeadLocked records the chain head after every line. It is rewritten
// every time rather than only at seals because a log cut between two seals
// is otherwise invisible; the cost is one small fsynced file per call,
// next to the log's own fsync and a sandbox run. The temporary file is
// fsynced before the rename, so the head is never empty or half written;
// the directory is not, so a crash may bring back the previous head, which
// verify accepts as one behind the log, never ahead of it.
func (a *Audit) writeHeadLocked() error {
	if a.headFile == "" || a.path == "" {
		return nil
	}
	h := auditHead{Path: a.path, Seq: a.seq - 1, Hash: a.last, Time: markTime(time.Now())}
	if a.key != nil {
		h.Key = PublicKeyString(a.key.Public().(ed25519.PublicKey))
		h.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(a.key, h.signed()))
	}
	data, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("audit head: %w", err)
	}
	dir := filepath.Dir(a.headFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("audit head: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".audit.head-*") // mode 0600
	if err != nil {
		return fmt.Errorf("audit head: %w", err)
	}
	_, err = tmp.Write(append(data, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), a.headFile)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("audit head %s: %w", a.headFile, err)
	}
	return nil
}

// sign fills a mark's key and signature, when there is a key.
func (a *Audit) sign(m *auditMark) {
	if a.key == nil {
		return
	}
	m.Key = PublicKeyString(a.key.Public().(ed25519.PublicKey))
	m.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(a.key, m.signed()))
}

// markLocked writes a signed mark, a genesis or a seal, over the chain so
// far (a genesis starts one: seq 0, nothing before it).
func (a *Audit) markLocked(kind string) error {
	m := auditMark{Kind: kind, Seq: a.seq, Prev: a.last, Time: markTime(time.Now()), Records: a.sinceMark}
	a.sign(&m)
	line, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("audit %s: %w", kind, err)
	}
	if _, err := a.emitLocked(kind, line); err != nil {
		return err
	}
	a.sinceMark = 0
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
	syncDir(filepath.Dir(a.path))
	return nil
}

// Close seals the records written since the last seal, then flushes and
// closes the log; later Writes fail.
func (a *Audit) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var serr error
	if a.chained && a.key != nil && !a.broken {
		if unlock, err := a.lockLocked(); err != nil {
			serr = err
		} else {
			a.followLocked()
			if err := a.chainLocked(); err != nil {
				serr = err
			} else if a.sinceMark > 0 {
				serr = a.markLocked(KindSeal)
			}
			unlock()
		}
	}
	if a.f == nil {
		return serr
	}
	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	a.f = nil
	if err != nil {
		return errors.Join(serr, fmt.Errorf("closing audit log %s: %w", a.path, err))
	}
	return serr
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
