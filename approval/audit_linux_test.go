package approval

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestAuditReadOnlyDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	line, _ := json.Marshal(sampleRecord("r"))
	a, err := OpenAudit(path, int64(len(line)+1))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Write(sampleRecord("r")); err != nil {
		t.Fatal(err)
	}
	// Root ignores directory permissions, so as root the directory is made
	// read-only the way an operator's would be: a read-only remount.
	refused := func(err error) bool { return errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS) }
	if os.Geteuid() == 0 {
		if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
			t.Fatalf("read-only remount: %v", err)
		}
	} else {
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
	}
	if f, err := os.Create(filepath.Join(dir, "probe")); err == nil {
		f.Close()
		t.Fatal("could still create a file in the read-only directory; the test proves nothing")
	}

	if _, err := OpenAudit(filepath.Join(dir, "other.jsonl"), 0); err == nil || !strings.Contains(err.Error(), "opening audit log") || !refused(err) {
		t.Errorf("OpenAudit in read-only dir err = %v, want a permission or read-only error", err)
	}
	// A server starting now is told before it runs anything.
	if err := NewAudit(path, 0).Check(); err == nil || !refused(err) {
		t.Errorf("Check of a log on a read-only path = %v, want a permission or read-only error", err)
	}
	// The next record needs a rotation, which the directory refuses.
	_, err = a.Write(sampleRecord("r2"))
	if err == nil || !strings.Contains(err.Error(), "rotating audit log") || !refused(err) {
		t.Errorf("Write needing rotation in read-only dir err = %v, want a rotation permission or read-only error", err)
	}
	if got := readLines(t, path); len(got) != 1 {
		t.Errorf("log holds %d records after failed write, want 1", len(got))
	}
}
