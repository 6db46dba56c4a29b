package approval

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chainLog is a sealed, rotated log in a directory of its own.
type chainLog struct {
	dir, path, key, head string
}

func newChainLog(t *testing.T) chainLog {
	dir := t.TempDir()
	return chainLog{dir: dir, path: filepath.Join(dir, "audit.jsonl"), key: filepath.Join(dir, "state", "audit.key"), head: filepath.Join(dir, "state", "audit.head")}
}

func (c chainLog) open(maxBytes int64, sealEvery int) *Audit {
	return NewAuditWith(AuditOptions{Path: c.path, MaxBytes: maxBytes, KeyFile: c.key, HeadFile: c.head, SealEvery: sealEvery})
}

func (c chainLog) pub(t *testing.T) ed25519.PublicKey {
	t.Helper()
	k, err := LoadAuditKey(c.key, false, true)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public().(ed25519.PublicKey)
}

func (c chainLog) verify(t *testing.T) (VerifyReport, error) {
	t.Helper()
	return VerifyAudit(VerifyOptions{Files: AuditFiles(c.path), Key: c.pub(t), Head: c.head})
}

// copyTo copies the log's files and its head into a new directory, the
// key staying where it is.
func (c chainLog) copyTo(t *testing.T) chainLog {
	t.Helper()
	n := newChainLog(t)
	n.key = c.key
	if err := os.MkdirAll(filepath.Dir(n.head), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(AuditFiles(c.path), c.head) {
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(n.dir, strings.TrimPrefix(p, c.dir))
		if err := os.WriteFile(to, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func writeN(t *testing.T, a *Audit, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := a.Write(sampleRecord(fmt.Sprintf("r%02d", i))); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
}

func fileLines(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(data, []byte("\n"))[:bytes.Count(data, []byte("\n"))]
}

func kindOf(line []byte) string {
	var l chainLine
	_ = json.Unmarshal(line, &l)
	return l.Kind
}

// A chain across writes, seals and rotations verifies; then each way of
// tampering with a copy of it is found, at the right line.
func TestAuditChainVerifyFindsTampering(t *testing.T) {
	log := newChainLog(t)
	recLen := int64(600) // a sample record's line is about 500 bytes
	a := log.open(6*recLen, 3)
	writeN(t, a, 0, 14)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(log.path + ".1"); err != nil {
		t.Fatalf("the log did not rotate: %v", err)
	}
	rep, err := log.verify(t)
	if err != nil {
		t.Fatalf("verify of an untouched log: %v", err)
	}
	if !rep.Genesis || rep.Records != 14 || rep.Seals != 5 || rep.FirstSeq != 0 || rep.LastSeq != 19 || !rep.HeadChecked || !rep.Signatures {
		t.Errorf("report %+v; want genesis, 14 records, 5 seals (every 3, and at close), seq 0 to 19, head and signatures checked", rep)
	}
	if s := rep.String(); !strings.HasPrefix(s, "ok: 14 records, 5 seals, chain from seq 0 to 19") {
		t.Errorf("report line %q", s)
	}

	cur := fileLines(t, log.path)
	if len(cur) < 4 || kindOf(cur[len(cur)-1]) != KindSeal {
		t.Fatalf("current file has %d lines, the last %q; want at least 4 ending in the close seal", len(cur), cur[len(cur)-1])
	}
	rec := -1 // a call record with a line after it
	for i := 0; i < len(cur)-1; i++ {
		if kindOf(cur[i]) == "" {
			rec = i
			break
		}
	}
	if rec < 0 {
		t.Fatal("no record in the current file")
	}
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	join := func(ls [][]byte) []byte { return bytes.Join(ls, nil) }
	cases := []struct {
		name    string
		mutate  func(lines [][]byte) []byte
		line    int // 1-based in the current file
		problem string
	}{
		{"edited field", func(ls [][]byte) []byte {
			ls[rec] = bytes.Replace(ls[rec], []byte(`"alice"`), []byte(`"alicf"`), 1)
			return join(ls)
		}, rec + 2, "prev does not match the line before"},
		{"deleted line", func(ls [][]byte) []byte {
			return join(append(ls[:1:1], ls[2:]...))
		}, 2, "prev does not match the line before"},
		{"swapped lines", func(ls [][]byte) []byte {
			ls[1], ls[2] = ls[2], ls[1]
			return join(ls)
		}, 2, "prev does not match the line before"},
		{"last whole record removed", func(ls [][]byte) []byte {
			return join(ls[:len(ls)-1])
		}, len(cur) - 1, "truncated: the head says seq 19, the log ends at 18"},
		{"last line cut mid-way", func(ls [][]byte) []byte {
			b := join(ls)
			return b[:len(b)-10]
		}, len(cur), "not JSON"},
		{"forged seal signature", func(ls [][]byte) []byte {
			var m auditMark
			last := ls[len(ls)-1]
			if err := json.Unmarshal(last, &m); err != nil {
				t.Fatal(err)
			}
			m.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(otherKey, m.signed()))
			forged, _ := json.Marshal(m)
			ls[len(ls)-1] = append(forged, '\n')
			return join(ls)
		}, len(cur), "bad seal signature"},
		{"records appended", func(ls [][]byte) []byte {
			return join(appendChained(t, ls, 2))
		}, len(cur) + 2, "lines appended"},
		{"last record edited", func(ls [][]byte) []byte {
			// Rewrite the close seal's time: nothing follows it but the head.
			ls[len(ls)-1] = bytes.Replace(ls[len(ls)-1], []byte(`"time":"2`), []byte(`"time":"1`), 1)
			return join(ls)
		}, len(cur), "bad seal signature"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := log.copyTo(t)
			lines := make([][]byte, len(cur))
			for i, l := range cur {
				lines[i] = bytes.Clone(l)
			}
			if err := os.WriteFile(c.path, tc.mutate(lines), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := c.verify(t)
			var be *BrokenError
			if !errors.As(err, &be) {
				t.Fatalf("verify = %v, want a broken record", err)
			}
			if be.File != c.path || be.Line != tc.line || !strings.Contains(be.Problem, tc.problem) {
				t.Errorf("verify found %v; want %s line %d: %s", be, c.path, tc.line, tc.problem)
			}
		})
	}
}

// appendChained adds n records correctly chained to lines, as someone
// without the key could.
func appendChained(t *testing.T, lines [][]byte, n int) [][]byte {
	t.Helper()
	last := bytes.TrimSuffix(lines[len(lines)-1], []byte("\n"))
	var l chainLine
	if err := json.Unmarshal(last, &l); err != nil {
		t.Fatal(err)
	}
	seq, prev := *l.Seq, LineHash(last)
	for i := 0; i < n; i++ {
		r := sampleRecord(fmt.Sprintf("forged%d", i))
		seq++
		r.Seq, r.Prev = seq, prev
		b, _ := json.Marshal(r)
		prev = LineHash(b)
		lines = append(lines, append(b, '\n'))
	}
	return lines
}

// One line past the head is what a crash between the log's write and the
// head's leaves: it verifies, and the report says so.
func TestAuditVerifyHeadOneBehind(t *testing.T) {
	log := newChainLog(t)
	a := log.open(0, 0)
	writeN(t, a, 0, 2)
	_ = a.Close()
	if err := os.WriteFile(log.path, bytes.Join(appendChained(t, fileLines(t, log.path), 1), nil), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := log.verify(t)
	if err != nil || rep.HeadBehind != 1 || !strings.Contains(rep.String(), "1 line past it") {
		t.Errorf("verify = %v, %v; want ok with the head one line behind", rep, err)
	}
}

// The first line of a kept file whose predecessors were rotated away
// cannot be checked, and verify says so instead of failing.
func TestAuditVerifyWithoutGenesis(t *testing.T) {
	log := newChainLog(t)
	a := log.open(3*600, 0)
	writeN(t, a, 0, 20)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := log.verify(t)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Genesis || rep.FirstSeq == 0 || !strings.Contains(rep.String(), "not at genesis") {
		t.Errorf("report %q (%+v); want it to say the chain starts after genesis", rep.String(), rep)
	}
}

// Each record's hash is the one Write returned, a reopened log goes on
// with the chain, and a seal after a crash counts the records since the
// last seal before it.
func TestAuditResume(t *testing.T) {
	log := newChainLog(t)
	a := log.open(0, 0)
	hashes := map[string]string{}
	for _, id := range []string{"r1", "r2"} {
		h, err := a.Write(sampleRecord(id))
		if err != nil {
			t.Fatal(err)
		}
		hashes[id] = h
	}
	if err := a.Close(); err != nil { // seals r1, r2
		t.Fatal(err)
	}
	// Reopen; then a crash: no Close, so no seal.
	b := log.open(0, 0)
	h, err := b.Write(sampleRecord("r3"))
	if err != nil {
		t.Fatal(err)
	}
	hashes["r3"] = h
	writeN(t, b, 4, 2)
	c := log.open(0, 0)
	writeN(t, c, 6, 1)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	lines := fileLines(t, log.path)
	var kinds []string
	prev := ""
	for i, l := range lines {
		l = bytes.TrimSuffix(l, []byte("\n"))
		var cl chainLine
		var r Record
		if err := json.Unmarshal(l, &cl); err != nil || json.Unmarshal(l, &r) != nil {
			t.Fatal(err)
		}
		if *cl.Seq != uint64(i) || *cl.Prev != prev {
			t.Errorf("line %d: seq %d prev %s; want seq %d prev %s", i+1, *cl.Seq, *cl.Prev, i, prev)
		}
		if want, ok := hashes[r.ID]; ok && cl.Kind == "" && LineHash(l) != want {
			t.Errorf("record %s: Write returned %s, the line on disk hashes to %s", r.ID, want, LineHash(l))
		}
		kinds = append(kinds, cl.Kind+"/"+r.ID+fmt.Sprint(cl.Records))
		prev = LineHash(l)
	}
	want := "genesis/0 /r10 /r20 seal/2 /r30 /r040 /r050 /r060 seal/4"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("lines %s; want %s", got, want)
	}
	if _, err := log.verify(t); err != nil {
		t.Errorf("verify: %v", err)
	}
}

func TestAuditSealEvery(t *testing.T) {
	log := newChainLog(t)
	a := log.open(0, 2)
	writeN(t, a, 0, 5)
	count := func() (seals []uint64) {
		for _, l := range fileLines(t, log.path) {
			var m auditMark
			_ = json.Unmarshal(l, &m)
			if m.Kind == KindSeal {
				seals = append(seals, m.Records)
			}
		}
		return seals
	}
	if got := fmt.Sprint(count()); got != "[2 2]" {
		t.Errorf("after 5 records seals cover %s; want [2 2]", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(count()); got != "[2 2 1]" {
		t.Errorf("after Close seals cover %s; want [2 2 1]", got)
	}
	// A second Close, or a server that wrote nothing, adds no seal.
	_ = a.Close()
	b := log.open(0, 2)
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if got := fmt.Sprint(count()); got != "[2 2 1]" {
		t.Errorf("after an idle restart seals cover %s; want [2 2 1]", got)
	}
}

func TestAuditKeyFile(t *testing.T) {
	log := newChainLog(t)
	if _, err := LoadAuditKey(log.key, false, true); err == nil || !strings.Contains(err.Error(), "no audit key yet") {
		t.Errorf("loading a missing key: %v", err)
	}
	a := log.open(0, 0)
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	st, err := os.Stat(log.key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key made with mode %04o, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(log.path)
	if bytes.Contains(raw, []byte("PRIVATE")) {
		t.Error("the private key is in the log")
	}
	if err := os.Chmod(log.key, 0o644); err != nil {
		t.Fatal(err)
	}
	err = log.open(0, 0).Check()
	if err == nil || !strings.Contains(err.Error(), "mode 0644") || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("Check with a 0644 key = %v; want a refusal saying to chmod 600", err)
	}
}

// A log cut while airlock was stopped is refused at the next start rather
// than continued, which would hide the cut.
func TestAuditRefusesLogCutWhileStopped(t *testing.T) {
	log := newChainLog(t)
	a := log.open(0, 0)
	writeN(t, a, 0, 3)
	_ = a.Close()
	lines := fileLines(t, log.path)
	if err := os.WriteFile(log.path, bytes.Join(lines[:len(lines)-2], nil), 0o600); err != nil {
		t.Fatal(err)
	}
	err := log.open(0, 0).Check()
	if err == nil || !strings.Contains(err.Error(), "records were removed") {
		t.Errorf("Check of a cut log = %v; want a refusal", err)
	}
	if err := os.Remove(log.path); err != nil {
		t.Fatal(err)
	}
	if err := log.open(0, 0).Check(); err == nil || !strings.Contains(err.Error(), "no chain left") {
		t.Errorf("Check of a removed log = %v; want a refusal", err)
	}
}

// A log an older airlock wrote gets a genesis line after its records; its
// records are reported as not chained.
func TestAuditChainAfterLegacyLog(t *testing.T) {
	log := newChainLog(t)
	var m map[string]any
	b, _ := json.Marshal(sampleRecord("old"))
	_ = json.Unmarshal(b, &m)
	delete(m, "seq")
	delete(m, "prev")
	old, _ := json.Marshal(m)
	if err := os.WriteFile(log.path, append(old, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	a := log.open(0, 0)
	writeN(t, a, 0, 1)
	_ = a.Close()
	rep, err := log.verify(t)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unchained != 1 || !rep.Genesis || rep.Records != 1 {
		t.Errorf("report %+v; want 1 unchained line, then genesis and 1 record", rep)
	}
}

// Airlocks sharing a state_dir share its log: two writers taking turns,
// concurrently and across a rotation, still make one chain.
func TestSharedLogOneChain(t *testing.T) {
	c := newChainLog(t)
	a, b := c.open(12000, 5), c.open(12000, 5)
	errs := make(chan error, 2)
	for _, w := range []*Audit{a, b} {
		go func(w *Audit) {
			for i := 0; i < 30; i++ {
				if _, err := w.Write(sampleRecord(fmt.Sprintf("r%02d", i))); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}(w)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []*Audit{a, b} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := c.verify(t)
	if err != nil {
		t.Fatalf("two writers broke the chain: %v", err)
	}
	if rep.Records != 60 {
		t.Errorf("verify counted %d records, want 60", rep.Records)
	}
	if _, err := os.Stat(c.path + ".1"); err != nil {
		t.Errorf("the log never rotated, so rotation under two writers went untested: %v", err)
	}
}
