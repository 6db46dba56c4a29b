package approval

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFormatRecord(t *testing.T) {
	r := sampleRecord("abc")
	r.Outcome, r.CodeBytes = OutcomeRan, 8
	got := FormatRecord(r)
	for _, want := range []string{"2026-01-02T03:04:05.000Z abc run_python", "client=claude-desktop/stdio", "decision=approved by=alice via=elicitation", "waited=1.2s", "outcome=ran exit=0 0.80s", "net=allowlist[", "code=abababababab/8B", "egress_denied=evil.com"} {
		if !strings.Contains(got, want) {
			t.Errorf("FormatRecord = %q, lacks %q", got, want)
		}
	}
	if got := formatLine([]byte("{not json")); !strings.HasPrefix(got, "(unreadable line") {
		t.Errorf("damaged line shown as %q", got)
	}
}

// syncBuf is a bytes.Buffer safe to read while Tail writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestTailLastAndFollowAcrossRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAudit(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := a.Write(sampleRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := Tail(context.Background(), path, 2, false, &out); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[0], " r2 ") || !strings.Contains(lines[1], " r3 ") {
		t.Fatalf("tail -n 2 = %q", out.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var follow syncBuf
	done := make(chan error, 1)
	go func() { done <- Tail(ctx, path, 0, true, &follow) }()
	time.Sleep(300 * time.Millisecond)
	_, _ = a.Write(sampleRecord("r4"))
	// Rotate by hand: rename and start a new file, as Audit does.
	a.Close()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	b, err := OpenAudit(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, _ = b.Write(sampleRecord("r5"))
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(follow.String(), " r5 ") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	got := follow.String()
	if !strings.Contains(got, " r4 ") || !strings.Contains(got, " r5 ") || strings.Contains(got, " r3 ") {
		t.Errorf("follow printed %q; want r4 and r5 only", got)
	}
}
