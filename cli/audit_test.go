package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/config"
)

// run runs `airlock audit ARGS…` against cfg and returns its output.
func runAudit(t *testing.T, cfg config.Config, args ...string) (string, error) {
	t.Helper()
	a := &app{cfg: cfg}
	cmd := a.auditCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// `airlock audit key` and `airlock audit verify` on the configured log: ok,
// then the first broken record after an edit, and exit status 1.
func TestAuditVerifyCommand(t *testing.T) {
	cfg := config.Defaults()
	cfg.StateDir = t.TempDir()
	if _, err := runAudit(t, cfg, "key"); err == nil || !strings.Contains(err.Error(), "no audit key yet") {
		t.Errorf("audit key before the first start: %v", err)
	}
	log := approval.NewAuditWith(approval.AuditOptions{Path: cfg.AuditFile(), KeyFile: cfg.AuditKeyFile(), HeadFile: cfg.AuditHeadFile(), SealEvery: 2})
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := log.Write(approval.Record{ID: id, Time: time.Now(), Tool: "run_python", Outcome: approval.OutcomeRan}); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	key, err := runAudit(t, cfg, "key")
	if err != nil || len(strings.TrimSpace(key)) != 44 {
		t.Fatalf("audit key = %q, %v; want a base64 public key", key, err)
	}
	out, err := runAudit(t, cfg, "verify")
	if err != nil || !strings.HasPrefix(out, "ok: 3 records, 2 seals, chain from seq 0 to 5") {
		t.Fatalf("verify = %q, %v", out, err)
	}
	// A copy verifies with the key given, but without state_dir's head.
	cp := filepath.Join(t.TempDir(), "copy.jsonl")
	data, _ := os.ReadFile(cfg.AuditPath())
	if err := os.WriteFile(cp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runAudit(t, cfg, "verify", cp, "--key", strings.TrimSpace(key)); err != nil || !strings.Contains(out, "no head file compared") {
		t.Errorf("verify of a copy = %q, %v", out, err)
	}

	edited := bytes.Replace(data, []byte(`"id":"r2"`), []byte(`"id":"r9"`), 1)
	if err := os.WriteFile(cfg.AuditPath(), edited, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runAudit(t, cfg, "verify")
	var ec exitCode
	if !errors.As(err, &ec) || ec != 1 || !strings.Contains(out, "audit.jsonl line 4 (seq 3): prev does not match") {
		t.Errorf("verify of an edited log = %q, %v; want line 4 named and exit status 1", out, err)
	}
}
