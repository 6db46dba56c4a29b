package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The wrapper adds airlock's flags to every runsc call, and
// --pod-init-config only to the call whose last argument is a container
// with a monitoring config (its create), found under any instance's dir.
func TestRunscWrapperFlags(t *testing.T) {
	state := t.TempDir()
	fake := filepath.Join(state, "fake-runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	mon := MonitorDir(state)
	cfg := filepath.Join(mon, "inst1", "airlock-abc123.json")
	if err := os.MkdirAll(filepath.Dir(cfg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := WriteRunscWrapper(state, fake, []string{"--directfs=false", "it's quoted"}, false, mon)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--root", "/r", "create", "--bundle", "/b", "airlock-abc123"},
			"--network=none --directfs=false it's quoted --pod-init-config=" + cfg + " --root /r create --bundle /b airlock-abc123"},
		{[]string{"--root", "/r", "create", "--bundle", "/b", "airlock-other"},
			"--network=none --directfs=false it's quoted --root /r create --bundle /b airlock-other"},
		{[]string{"kill", "airlock-abc123", "9"}, "--network=none --directfs=false it's quoted kill airlock-abc123 9"},
		{[]string{"delete", "airlock-../inst1/airlock-abc123"}, "--network=none --directfs=false it's quoted delete airlock-../inst1/airlock-abc123"},
		{nil, "--network=none --directfs=false it's quoted"},
	} {
		out, err := exec.Command(w, c.args...).Output()
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("%v:\n got %s\nwant %s", c.args, got, c.want)
		}
	}
}

// Wrappers with different flags are different files, so managers sharing a
// state_dir never rewrite each other's; the same flags give the same file.
func TestRunscWrapperPerFlags(t *testing.T) {
	state := t.TempDir()
	w := func(flags ...string) string {
		t.Helper()
		p, err := WriteRunscWrapper(state, "/usr/local/bin/runsc", flags, false, "")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	off, on := w("--directfs=false"), w("--directfs=true")
	if off == on {
		t.Fatalf("both flag sets share %s", off)
	}
	if again := w("--directfs=false"); again != off {
		t.Errorf("same flags, new wrapper %s (was %s)", again, off)
	}
	b, err := os.ReadFile(off)
	if err != nil || !strings.Contains(string(b), "--directfs=false") {
		t.Errorf("%s lost its flags: %q %v", off, b, err)
	}
	if net, err := WriteRunscWrapper(state, "/usr/local/bin/runsc", []string{"--directfs=false"}, true, ""); err != nil || net == off {
		t.Errorf("networked wrapper %s, err %v", net, err)
	}
}
