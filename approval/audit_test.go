package approval

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func sampleRecord(id string) Record {
	code := 0
	return Record{
		ID: id, Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Client: "claude-desktop", Transport: "stdio", Tool: "run_python",
		CodeSHA256: strings.Repeat("ab", 32), Decision: "approved", Approver: "alice",
		Channel: "elicitation", WaitMS: 1200, Limits: Limits{TimeoutS: 30, MemoryMB: 256},
		Network: "allowlist", EgressDenied: []string{"evil.com"}, ExitCode: &code,
		DurationMS: 800, StdoutBytes: 10, StderrBytes: 0, Truncated: false, LimitHit: "",
	}
}

// readLines returns the call records of path, failing on any line that is
// not complete JSON; seals and the genesis line are left out.
func readLines(t *testing.T, path string) []Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Errorf("%s does not end with a newline: a partial record", path)
	}
	var out []Record
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct {
			Record
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: line %q is not a JSON record: %v", path, sc.Text(), err)
		}
		if r.Kind == "" {
			out = append(out, r.Record)
		}
	}
	return out
}

func TestAuditWritesJSONLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAudit(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	denied := sampleRecord("r2")
	denied.ExitCode, denied.Decision, denied.Code = nil, "denied", "print('hi')\n"
	for _, r := range []Record{sampleRecord("r1"), denied} {
		if _, err := a.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	// Every byte is on disk before Close: read through another handle now.
	got := readLines(t, path)
	if len(got) != 2 || got[0].ID != "r1" || got[1].ID != "r2" {
		t.Fatalf("records = %+v, want r1 then r2", got)
	}
	if got[0].ExitCode == nil || *got[0].ExitCode != 0 || got[1].ExitCode != nil {
		t.Errorf("exit codes = %v, %v; want 0 and null", got[0].ExitCode, got[1].ExitCode)
	}
	if got[1].Code != "print('hi')\n" || got[1].Limits.MemoryMB != 256 {
		t.Errorf("record r2 round-tripped as %+v", got[1])
	}
	raw, _ := os.ReadFile(path)
	lines := strings.SplitN(string(raw), "\n", 3)
	if !strings.Contains(lines[0], `"kind":"genesis"`) {
		t.Errorf("first line %s is not the genesis line", lines[0])
	}
	first := lines[1]
	for _, key := range []string{"seq", "prev", "id", "time", "client", "transport", "tool", "code_sha256", "decision", "approver", "channel", "wait_ms", "limits", "network", "egress_denied", "exit_code", "duration_ms", "stdout_bytes", "stderr_bytes", "truncated", "limit_hit"} {
		if !strings.Contains(first, `"`+key+`":`) {
			t.Errorf("line %s lacks key %q", first, key)
		}
	}
	if strings.Contains(first, `"code":`) {
		t.Errorf("empty code was written: %s", first)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(sampleRecord("late")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close err = %v, want os.ErrClosed", err)
	}
	// Reopening appends instead of truncating.
	b, err := OpenAudit(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Write(sampleRecord("r3")); err != nil {
		t.Fatal(err)
	}
	if n := len(readLines(t, path)); n != 3 {
		t.Errorf("after reopen %d records, want 3", n)
	}
}

func TestAuditRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	r := sampleRecord("r00")
	r.Seq, r.Prev = 10, strings.Repeat("0", 64)
	line, _ := json.Marshal(r)
	lineLen := int64(len(line) + 1)
	// Room for exactly two records per file (or the genesis line and one).
	a, err := OpenAudit(path, 2*lineLen)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := 0; i < 10; i++ {
		if _, err := a.Write(sampleRecord(fmt.Sprintf("r%02d", i))); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if st, err := os.Stat(path); err != nil || st.Size() > 2*lineLen {
			t.Fatalf("after write %d current file is %v bytes (err %v), cap %d", i, st.Size(), err, 2*lineLen)
		}
	}
	// The genesis line and 10 records, 2 per file: current r09, .1 r07
	// r08, .2 r05 r06, .3 r03 r04; the rest were dropped with older files.
	want := map[string][]string{
		path:        {"r09"},
		path + ".1": {"r07", "r08"},
		path + ".2": {"r05", "r06"},
		path + ".3": {"r03", "r04"},
	}
	for p, ids := range want {
		got := readLines(t, p)
		var gotIDs []string
		for _, r := range got {
			gotIDs = append(gotIDs, r.ID)
		}
		if strings.Join(gotIDs, ",") != strings.Join(ids, ",") {
			t.Errorf("%s holds %v, want %v", filepath.Base(p), gotIDs, ids)
		}
	}
	if _, err := os.Stat(path + ".4"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.4 exists (err %v); want at most 3 rotated files", path, err)
	}
}

func TestAuditOpenFails(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenAudit(filepath.Join(notDir, "audit.jsonl"), 0)
	if err == nil || !strings.Contains(err.Error(), "opening audit log") || !strings.Contains(err.Error(), "audit.jsonl") {
		t.Errorf("OpenAudit under a file err = %v, want an error naming the audit log path", err)
	}
}

func TestAuditConcurrentWholeLines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	a, err := OpenAudit(path, 0) // no rotation: every record must be found
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r := sampleRecord(fmt.Sprintf("w%d-%d", w, i))
				r.Code = strings.Repeat("x", 2000) // big enough to tear if writes interleaved
				if _, err := a.Write(r); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range readLines(t, path) {
		if seen[r.ID] {
			t.Errorf("record %s appears twice", r.ID)
		}
		seen[r.ID] = true
	}
	if len(seen) != writers*each {
		t.Errorf("found %d whole records, want %d", len(seen), writers*each)
	}
}

// failingWriter fails every write, as a closed stdout does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// A mirrored log writes each record to the mirror, and to the file only
// when it has a path; a mirror that fails fails the write, so no call runs
// unrecorded.
func TestAuditMirrored(t *testing.T) {
	for _, withFile := range []bool{true, false} {
		t.Run(fmt.Sprintf("file %v", withFile), func(t *testing.T) {
			path := ""
			if withFile {
				path = filepath.Join(t.TempDir(), "audit.jsonl")
			}
			var mirror strings.Builder
			a := NewAuditMirrored(path, 0, &mirror)
			if err := a.Check(); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"r1", "r2"} {
				if _, err := a.Write(sampleRecord(id)); err != nil {
					t.Fatal(err)
				}
			}
			lines := strings.Split(strings.TrimSuffix(mirror.String(), "\n"), "\n")
			if len(lines) != 3 || !strings.Contains(lines[0], `"kind":"genesis"`) {
				t.Fatalf("mirror got %d lines, want the genesis line and 2 records: %q", len(lines), mirror.String())
			}
			for i, l := range lines[1:] {
				var r Record
				if err := json.Unmarshal([]byte(l), &r); err != nil || r.ID != fmt.Sprintf("r%d", i+1) {
					t.Errorf("mirror line %d %q: %v", i, l, err)
				}
			}
			if withFile {
				if got := readLines(t, path); len(got) != 2 {
					t.Errorf("file has %d records, want 2", len(got))
				}
			}
			if _, err := NewAuditMirrored(path, 0, failingWriter{}).Write(sampleRecord("r3")); err == nil {
				t.Error("a failing mirror did not fail the write")
			}
		})
	}
}
