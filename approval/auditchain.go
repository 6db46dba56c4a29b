package approval

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// The audit log is a hash chain: every line carries seq (0 for the genesis
// line) and prev, the hex SHA-256 of the previous line's exact bytes
// without its newline. Besides call records the chain has two kinds of
// marks, told apart by their "kind": the genesis line that starts a chain,
// and seals, signed with the key in state_dir, every audit.seal_every
// records and at shutdown.
const (
	KindGenesis = "genesis"
	KindSeal    = "seal"
)

// maxAuditLine bounds one line when reading a log, which may be hostile.
const maxAuditLine = 16 << 20

// auditMark is a genesis or seal line. Time is a string so that the bytes
// signed are exactly the bytes written.
type auditMark struct {
	Kind string `json:"kind"`
	Seq  uint64 `json:"seq"`
	Prev string `json:"prev"`
	Time string `json:"time"`
	// Records is how many lines the seal covers since the previous seal or
	// genesis.
	Records uint64 `json:"records,omitempty"`
	Key     string `json:"key,omitempty"`
	Sig     string `json:"sig,omitempty"`
}

// signed is the canonical byte string a mark's signature covers.
func (m auditMark) signed() []byte {
	return fmt.Appendf(nil, "airlock-audit/v1\nkind=%s\nseq=%d\nprev=%s\ntime=%s\nrecords=%d\n", m.Kind, m.Seq, m.Prev, m.Time, m.Records)
}

// auditHead is the chain head kept in state_dir: the seq and hash of the
// last line written, so that a log cut after its last line is seen.
type auditHead struct {
	Path string `json:"path"`
	Seq  uint64 `json:"seq"`
	Hash string `json:"hash"`
	Time string `json:"time"`
	Key  string `json:"key,omitempty"`
	Sig  string `json:"sig,omitempty"`
}

func (h auditHead) signed() []byte {
	return fmt.Appendf(nil, "airlock-audit-head/v1\npath=%s\nseq=%d\nhash=%s\ntime=%s\n", h.Path, h.Seq, h.Hash, h.Time)
}

// chainLine is what verify reads of any line; pointers tell a missing
// field from a zero one.
type chainLine struct {
	Kind    string  `json:"kind"`
	Seq     *uint64 `json:"seq"`
	Prev    *string `json:"prev"`
	Time    string  `json:"time"`
	Records uint64  `json:"records"`
	Key     string  `json:"key"`
	Sig     string  `json:"sig"`
}

func (l chainLine) mark() auditMark {
	m := auditMark{Kind: l.Kind, Time: l.Time, Records: l.Records, Key: l.Key, Sig: l.Sig}
	if l.Seq != nil {
		m.Seq = *l.Seq
	}
	if l.Prev != nil {
		m.Prev = *l.Prev
	}
	return m
}

// LineHash is the hash a line is chained by: hex SHA-256 of its bytes
// without the newline.
func LineHash(line []byte) string {
	s := sha256.Sum256(line)
	return hex.EncodeToString(s[:])
}

// AuditFiles are the log at path and its rotated files, oldest first.
func AuditFiles(path string) []string {
	out := make([]string, 0, auditKeep+1)
	for i := auditKeep; i >= 1; i-- {
		out = append(out, fmt.Sprintf("%s.%d", path, i))
	}
	return append(out, path)
}

// lastLine returns the last line of the file at path without its newline;
// nil when the file is missing or empty. A last line without a newline is
// an error: a record cut mid-way.
func lastLine(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size == 0 {
		return nil, nil
	}
	for n := int64(64 << 10); ; n *= 2 {
		if n > size {
			n = size
		}
		buf := make([]byte, n)
		if _, err := f.ReadAt(buf, size-n); err != nil {
			return nil, err
		}
		if buf[n-1] != '\n' {
			return nil, errors.New("its last line has no newline: a record was cut mid-way")
		}
		body := buf[:n-1]
		if i := bytes.LastIndexByte(body, '\n'); i >= 0 {
			return body[i+1:], nil
		}
		if n == size {
			return body, nil
		}
		if n > maxAuditLine {
			return nil, fmt.Errorf("its last line is longer than %d bytes", maxAuditLine)
		}
	}
}

// splitLines is bufio.ScanLines that keeps '\r' (the hash covers exact
// bytes) and flags a last line that has no newline.
func splitLines(cut *bool) bufio.SplitFunc {
	return func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			*cut = true
			return len(data), data, nil
		}
		return 0, nil, nil
	}
}

// eachLine calls fn with every line of the file at path (missing: none).
func eachLine(path string, fn func(n int, line []byte, cut bool) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	cut := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxAuditLine)
	sc.Split(splitLines(&cut))
	n := 0
	for sc.Scan() {
		n++
		if err := fn(n, sc.Bytes(), cut); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &BrokenError{File: path, Line: n + 1, Problem: fmt.Sprintf("line longer than %d bytes", maxAuditLine)}
		}
		return err
	}
	return nil
}

// linesSinceMark counts the call records written after the last seal or
// genesis, looking through files newest first; it is what the next seal's
// records says. Only a server resuming after a crash needs it.
func linesSinceMark(newestFirst []string) (uint64, error) {
	var total uint64
	for _, p := range newestFirst {
		var after uint64
		marked := false
		err := eachLine(p, func(_ int, line []byte, _ bool) error {
			var l chainLine
			if json.Unmarshal(line, &l) != nil || l.Seq == nil {
				return nil
			}
			if l.Kind != "" {
				after, marked = 0, true
			} else {
				after++
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		total += after
		if marked {
			break
		}
	}
	return total, nil
}

// BrokenError is the first line of a log that does not verify.
type BrokenError struct {
	File string
	// Line is 1-based within File.
	Line int
	// Seq is the line's seq, when it has one.
	Seq     *uint64
	Problem string
}

func (e *BrokenError) Error() string {
	s := fmt.Sprintf("%s line %d", e.File, e.Line)
	if e.Seq != nil {
		s += fmt.Sprintf(" (seq %d)", *e.Seq)
	}
	return s + ": " + e.Problem
}

// VerifyOptions says what VerifyAudit checks.
type VerifyOptions struct {
	// Files are the log's files, oldest first; missing ones are skipped.
	Files []string
	// Key checks the signatures of seals, genesis and head; nil leaves them
	// unchecked (the report says so).
	Key ed25519.PublicKey
	// Head is the chain head file to compare the log's end with; empty: none.
	Head string
}

// VerifyReport is what a log that verifies holds.
type VerifyReport struct {
	Records, Seals int
	FirstSeq       uint64
	LastSeq        uint64
	// Genesis says the chain starts at its genesis line; otherwise older
	// files were rotated away and the first line's prev is not checked.
	Genesis bool
	// Unchained counts lines written before the chain began (an older
	// airlock's records), which nothing protects.
	Unchained int
	// Signatures says a key checked the seals; HeadChecked that a head file
	// was compared; HeadBehind how many lines the log has past the head.
	Signatures  bool
	HeadChecked bool
	HeadBehind  uint64
}

// String is the report's one line, as `airlock audit verify` prints it.
func (r VerifyReport) String() string {
	s := fmt.Sprintf("ok: %d records, %d seals, chain from seq %d to %d", r.Records, r.Seals, r.FirstSeq, r.LastSeq)
	if r.Genesis {
		s += " (from genesis)"
	} else {
		s += fmt.Sprintf("; the oldest kept file starts at seq %d, not at genesis (older files were rotated away), so that line's prev is not checked", r.FirstSeq)
	}
	if r.Unchained > 0 {
		s += fmt.Sprintf("; %d lines before genesis are not chained", r.Unchained)
	}
	if !r.Signatures {
		s += "; signatures NOT checked (no key)"
	}
	switch {
	case !r.HeadChecked:
		s += "; no head file compared"
	case r.HeadBehind > 0:
		s += fmt.Sprintf("; head checked (the log has %d line past it, as a crash or a write in progress leaves)", r.HeadBehind)
	default:
		s += "; head checked"
	}
	return s
}

// VerifyAudit checks a log: every line's prev against the line before,
// seq continuity, every seal's signature, and the log's end against the
// head. The error is a *BrokenError naming the first broken line, or why
// the log could not be read.
func VerifyAudit(o VerifyOptions) (VerifyReport, error) {
	var (
		rep      VerifyReport
		started  bool
		lastSeq  uint64
		lastHash string
		lastFile string
		lastLn   int
		// sinceMark counts records since the last mark; markSeen says one
		// is in view, so a seal's records can be checked.
		sinceMark uint64
		markSeen  bool
		head      *auditHead
		// headHash is the hash of the line at head.Seq, once read, and
		// headAt where it is.
		headHash string
		headAt   BrokenError
		// pastAt is the second line past the head, which a crash cannot
		// explain (see writeHeadLocked).
		pastAt *BrokenError
		keyStr string
	)
	if o.Key != nil {
		keyStr = PublicKeyString(o.Key)
		rep.Signatures = true
	}
	if o.Head != "" {
		data, err := os.ReadFile(o.Head)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return rep, fmt.Errorf("audit head: %w", err)
		default:
			head = new(auditHead)
			if err := json.Unmarshal(data, head); err != nil {
				return rep, &BrokenError{File: o.Head, Line: 1, Problem: "the head file is not JSON: " + err.Error()}
			}
			if err := checkSig(o.Key, keyStr, head.Key, head.Sig, head.signed()); err != "" {
				return rep, &BrokenError{File: o.Head, Line: 1, Problem: "head: " + err}
			}
		}
	}
	sawLine := false
	for _, file := range o.Files {
		err := eachLine(file, func(n int, line []byte, cut bool) error {
			sawLine = true
			broken := func(seq *uint64, problem string) error {
				return &BrokenError{File: file, Line: n, Seq: seq, Problem: problem}
			}
			if cut {
				return broken(nil, "not JSON: the last line has no newline (cut mid-record)")
			}
			var l chainLine
			if err := json.Unmarshal(line, &l); err != nil {
				return broken(nil, "not JSON: "+err.Error())
			}
			hash := LineHash(line)
			if l.Seq == nil || l.Prev == nil {
				if started {
					return broken(nil, "no seq or prev: not a chain line (inserted or edited record)")
				}
				rep.Unchained++
				return nil
			}
			seq := *l.Seq
			switch {
			case !started && l.Kind == KindGenesis:
				if seq != 0 || *l.Prev != "" {
					return broken(&seq, "a genesis line must have seq 0 and an empty prev")
				}
				rep.Genesis = true
			case !started:
				if rep.Unchained > 0 {
					return broken(&seq, "the chain does not start with a genesis line after the unchained lines")
				}
			case l.Kind == KindGenesis:
				return broken(&seq, "a second genesis line inside the chain (a log spliced in, or restarted)")
			case *l.Prev != lastHash:
				return broken(&seq, fmt.Sprintf("prev does not match the line before (%s line %d): an edited, deleted or reordered record", lastFile, lastLn))
			case seq != lastSeq+1:
				return broken(&seq, fmt.Sprintf("seq %d follows seq %d: a record is missing, repeated or reordered", seq, lastSeq))
			}
			switch l.Kind {
			case "":
				rep.Records++
				sinceMark++
			case KindGenesis, KindSeal:
				m := l.mark()
				if e := checkSig(o.Key, keyStr, m.Key, m.Sig, m.signed()); e != "" {
					return broken(&seq, fmt.Sprintf("bad %s signature: %s", l.Kind, e))
				}
				if l.Kind == KindSeal {
					if markSeen && m.Records != sinceMark {
						return broken(&seq, fmt.Sprintf("the seal covers %d records, but %d lie since the previous seal (records deleted or inserted)", m.Records, sinceMark))
					}
					rep.Seals++
				}
				sinceMark, markSeen = 0, true
			default:
				return broken(&seq, fmt.Sprintf("unknown kind %q", l.Kind))
			}
			if !started {
				rep.FirstSeq = seq
				started = true
			}
			lastSeq, lastHash, lastFile, lastLn = seq, hash, file, n
			if head != nil && seq == head.Seq {
				headHash, headAt = hash, BrokenError{File: file, Line: n, Seq: &seq}
			}
			if head != nil && seq == head.Seq+2 && pastAt == nil {
				pastAt = &BrokenError{File: file, Line: n, Seq: &seq}
			}
			return nil
		})
		if err != nil {
			var be *BrokenError
			if errors.As(err, &be) {
				return rep, err
			}
			return rep, fmt.Errorf("audit log: %w", err)
		}
	}
	if !sawLine {
		return rep, fmt.Errorf("audit log: no records in %s", strings.Join(o.Files, ", "))
	}
	rep.LastSeq = lastSeq
	if head != nil {
		rep.HeadChecked = true
		end := &BrokenError{File: lastFile, Line: lastLn, Seq: &lastSeq}
		switch {
		case !started || lastSeq < head.Seq:
			end.Problem = fmt.Sprintf("truncated: the head says seq %d, the log ends at %d", head.Seq, lastSeq)
			if !started {
				end.Seq = nil
				end.Problem = fmt.Sprintf("truncated: the head says seq %d, the log has no chain", head.Seq)
			}
			return rep, end
		case headHash != head.Hash:
			if headHash == "" {
				// The head's line is in a file rotated away: nothing to compare.
				rep.HeadChecked = false
				break
			}
			headAt.Problem = fmt.Sprintf("the line at seq %d does not match the head's hash (an edited record, or another log put in its place)", head.Seq)
			return rep, &headAt
		}
		if rep.HeadChecked && pastAt != nil {
			// airlock rewrites the head after every line; a crash between the
			// two writes leaves it one line behind, never more.
			pastAt.Problem = fmt.Sprintf("the head says the log ends at seq %d, but it goes on to %d: lines appended after airlock wrote them", head.Seq, lastSeq)
			return rep, pastAt
		}
		rep.HeadBehind = lastSeq - head.Seq
	}
	return rep, nil
}

// checkSig checks sig over msg with the trusted key; it returns what is
// wrong, or "".
func checkSig(key ed25519.PublicKey, keyStr, lineKey, sig string, msg []byte) string {
	if key == nil {
		return ""
	}
	if sig == "" {
		return "it is not signed"
	}
	if lineKey != "" && lineKey != keyStr {
		return fmt.Sprintf("signed by another key (%s), not the trusted one (%s)", lineKey, keyStr)
	}
	b, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || !ed25519.Verify(key, msg, b) {
		return "the signature does not verify"
	}
	return ""
}

// markTime is how marks and heads write their time.
func markTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
