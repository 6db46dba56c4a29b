package monitor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// TestCaptureCorpus, run by hand as root with MONITOR_CAPTURE=1 (and runsc
// on PATH), starts a real runsc sandbox whose trace session reports to a
// socket of this test's, has it try a few hostile things, and writes the
// first message of each type and kind it sent, byte for byte, into
// FuzzParseMessage's seed corpus as captured_*: real events, not ones this
// package encoded itself.
//
//	sudo MONITOR_CAPTURE=1 go test ./runtime/monitor -run TestCaptureCorpus -v
func TestCaptureCorpus(t *testing.T) {
	if os.Getenv("MONITOR_CAPTURE") != "1" {
		t.Skip("writes the captured seed corpus; run by hand with MONITOR_CAPTURE=1")
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	ln, err := listenSeqpacket(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, err := Config(sock)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "pod-init.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan [][]byte, 1)
	go func() {
		var msgs [][]byte
		defer func() { got <- msgs }()
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		l := &Listener{opts: Options{}}
		if err := l.handshake(c); err != nil {
			t.Errorf("handshake: %v", err)
			return
		}
		buf := make([]byte, MaxMessageSize)
		for {
			n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
			if err != nil || n == 0 {
				return
			}
			if flags&unix.MSG_TRUNC == 0 {
				msgs = append(msgs, append([]byte(nil), buf[:n]...))
			}
		}
	}()
	script := `mount -t tmpfs none /mnt; unshare -U true; echo x > /proc/sys/kernel/hostname; ` +
		`python3 -c 'import ctypes, socket, os
libc = ctypes.CDLL(None)
libc.ptrace(0, 0, 0, 0)
libc.syscall(321, 0, 0, 0)
try: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)
except OSError: pass
try: socket.create_connection(("192.0.2.1", 9), timeout=1)
except OSError: pass
os.setuid(65534)
try: os.setuid(0)
except OSError: pass
try: open("/usr/captured", "w")
except OSError: pass'`
	cmd := exec.Command(runsc, "--root", filepath.Join(dir, "root"), "--network=none", "--pod-init-config="+cfgPath, "do", "/bin/sh", "-c", script)
	out, err := cmd.CombinedOutput()
	t.Logf("runsc do: %v\n%s", err, out)
	msgs := <-got
	corpus := filepath.Join("testdata", "fuzz", "FuzzParseMessage")
	seen := map[string]bool{}
	for _, m := range msgs {
		h, msg, err := ParseMessage(m)
		if err != nil {
			t.Errorf("a captured message does not parse: %v", err)
			continue
		}
		key := fmt.Sprintf("captured_%s", pb.MessageType(h.MessageType))
		if kind, sc, _, ok := Classify(pb.MessageType(h.MessageType), msg); ok {
			key += "_" + string(kind) + "_" + sc
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := os.WriteFile(filepath.Join(corpus, key), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", m), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", key, len(m))
	}
	if len(seen) == 0 {
		t.Fatal("runsc sent nothing")
	}
}

// The captured events (TestCaptureCorpus) parse, and those named for a
// kind still classify as that kind: the classifier is checked against what
// a real sentry sends, not only against messages this package built.
func TestCapturedEventsClassify(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParseMessage", "captured_*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured events: %v", err)
	}
	kinds := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var raw string
		if _, err := fmt.Sscanf(strings.TrimPrefix(string(data), "go test fuzz v1\n"), "[]byte(%q)", &raw); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		h, msg, err := ParseMessage([]byte(raw))
		if err != nil {
			t.Errorf("%s does not parse: %v", f, err)
			continue
		}
		name := strings.TrimPrefix(filepath.Base(f), "captured_"+pb.MessageType(h.MessageType).String())
		kind, sc, _, ok := Classify(pb.MessageType(h.MessageType), msg)
		switch {
		case name == "" && ok:
			t.Errorf("%s: classified %s (%s), captured as no attempt", f, kind, sc)
		case name != "" && (!ok || name != "_"+string(kind)+"_"+sc):
			t.Errorf("%s: classified %q %q %v", f, kind, sc, ok)
		case name != "":
			kinds++
		}
	}
	if kinds < 8 {
		t.Errorf("only %d captured attempts classified; the corpus should hold one of most kinds", kinds)
	}
}
