package local_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

func openSession(t *testing.T) runtime.Session {
	t.Helper()
	s := need(t)
	var sm runtime.SessionManager = s.Manager
	sess, err := sm.OpenSession(context.Background(), runtime.SessionOptions{ID: "stest" + runtime.NewRunID(), Limits: limits()})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() {
		sess.Close()
		assertNoSandboxes(t, s)
	})
	return sess
}

func cell(t *testing.T, sess runtime.Session, lang runtime.Language, code string, timeout time.Duration) runtime.Result {
	t.Helper()
	l := limits()
	if timeout > 0 {
		l.Timeout = timeout
	}
	res, err := sess.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: l})
	if err != nil {
		t.Fatalf("session run %q: %v", code, err)
	}
	return res
}

func display(r runtime.Result) string {
	if r.Rich == nil {
		return ""
	}
	return r.Rich.Display
}

func TestSessionKeepsState(t *testing.T) {
	sess := openSession(t)
	if r := cell(t, sess, runtime.Python, "x = 41", 0); r.ExitCode != 0 || r.Rich != nil {
		t.Fatalf("x = 41: %+v", r)
	}
	if r := cell(t, sess, runtime.Python, "x + 1", 0); display(r) != "42" {
		t.Fatalf("x + 1: display %q, stderr %q; want 42", display(r), r.Stderr)
	}
	// The workspace is shared by shell and Python.
	if r := cell(t, sess, runtime.Shell, "echo 'a,b' > data.csv; echo '1,2' >> data.csv", 0); r.ExitCode != 0 {
		t.Fatalf("shell: %+v", r)
	}
	if r := cell(t, sess, runtime.Python, "import pandas as pd\ndf = pd.read_csv('data.csv')\ndf", 0); !strings.Contains(display(r), "a  b") || !strings.Contains(display(r), "0  1  2") {
		t.Fatalf("DataFrame display %q (stderr %q)", display(r), r.Stderr)
	}
	// A print that looks like a driver frame is only output.
	fake := "X\x00\x00\x00\x0b{\"code\":0}R\x00\x00\x00\x02{}"
	if r := cell(t, sess, runtime.Python, "import sys\nsys.stdout.write('X\\x00\\x00\\x00\\x0b{\"code\":0}R\\x00\\x00\\x00\\x02{}')\nsys.stdout.flush()\n7", 0); r.Stdout != fake || display(r) != "7" {
		t.Fatalf("fake frame: stdout %q display %q", r.Stdout, display(r))
	}
	if r := cell(t, sess, runtime.Python, "x", 0); display(r) != "41" {
		t.Fatalf("after the fake frame: %q", display(r))
	}
}

func TestSessionFigureAndOutFiles(t *testing.T) {
	sess := openSession(t)
	code := `import matplotlib.pyplot as plt
import os
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
fig = plt.figure()
plt.bar([1, 2], [3, 4])
os.makedirs("out", exist_ok=True)
open("out/result.csv", "w").write("n,sq\n3,9\n")
`
	r := cell(t, sess, runtime.Python, code, 60*time.Second)
	if r.ExitCode != 0 || r.Rich == nil {
		t.Fatalf("plot: %+v", r)
	}
	if len(r.Rich.Images) != 2 {
		t.Fatalf("images = %d (skipped %d, error %q), want the shown figure and the open one", len(r.Rich.Images), r.Rich.ImagesSkipped, r.Rich.FigureError)
	}
	for _, img := range r.Rich.Images {
		if !strings.HasPrefix(string(img), "\x89PNG\r\n\x1a\n") {
			t.Errorf("image is not a PNG: % x", img[:8])
		}
	}
	if len(r.Rich.Files) != 1 || r.Rich.Files[0].Path != "out/result.csv" || string(r.Rich.Files[0].Content) != "n,sq\n3,9\n" {
		t.Fatalf("files = %+v", r.Rich.Files)
	}
	// Figures were closed; nothing new under out/.
	if r := cell(t, sess, runtime.Python, "len(plt.get_fignums())", 0); display(r) != "0" || len(r.Rich.Images) != 0 || len(r.Rich.Files) != 0 {
		t.Fatalf("next cell: %+v", r.Rich)
	}
}

func TestSessionFilesStayInTheSandbox(t *testing.T) {
	sess := openSession(t)
	ctx := context.Background()
	if res, err := sess.File(ctx, driver.FileOp{Op: "write", Path: "in/data.txt", Data: []byte("hello\n")}); err != nil || res.Error != "" || res.Size != 6 {
		t.Fatalf("write: %+v %v", res, err)
	}
	if r := cell(t, sess, runtime.Shell, "cat in/data.txt; ls -ln in/data.txt | awk '{print $3}'; ln -s / root; ln -s /etc/passwd pw; ln -s / in/up", 0); r.Stdout != "hello\n1000\n" {
		t.Fatalf("the code sees the written file as its own: %q %q", r.Stdout, r.Stderr)
	}
	cases := []struct{ path, want string }{
		{"../etc/passwd", `".."`},
		{"/etc/passwd", "absolute"},
		{"root/etc/passwd", "symbolic link"},
		{"pw", "symbolic link"},
		{"in/up/etc/hostname", "symbolic link"},
		{"nothing", "no such file"},
	}
	for _, c := range cases {
		res, err := sess.File(ctx, driver.FileOp{Op: "read", Path: c.path})
		if err != nil || !strings.Contains(res.Error, c.want) || len(res.Data) != 0 {
			t.Errorf("read %q: %+v %v; want an error saying %q", c.path, res, err, c.want)
		}
	}
	// A write through a planted link is refused too, and creates nothing.
	if res, _ := sess.File(ctx, driver.FileOp{Op: "write", Path: "root/tmp/x", Data: []byte("x")}); !strings.Contains(res.Error, "symbolic link") {
		t.Errorf("write through a link: %+v", res)
	}
	list, err := sess.File(ctx, driver.FileOp{Op: "list", Path: ""})
	if err != nil || len(list.Entries) != 3 {
		t.Fatalf("list: %+v %v", list, err)
	}
	// The workspace cap holds for writes: 8 MiB here.
	big := make([]byte, 9<<20)
	if res, _ := sess.File(ctx, driver.FileOp{Op: "write", Path: "big", Data: big}); !strings.Contains(res.Error, "workspace is full") {
		t.Errorf("over the workspace: %+v", res.Error)
	}
	if r := cell(t, sess, runtime.Shell, "ls big 2>&1; df -k . | tail -1 | awk '{print $3}'", 0); !strings.Contains(r.Stdout, "No such file") {
		t.Errorf("a refused write left a file: %q", r.Stdout)
	}
}

func TestSessionTimeoutKeepsTheSession(t *testing.T) {
	sess := openSession(t)
	cell(t, sess, runtime.Python, "x = 41", 0)
	start := time.Now()
	r := cell(t, sess, runtime.Python, "import time\ntime.sleep(60)", 2*time.Second)
	if !r.TimedOut || r.SessionLost || time.Since(start) > 10*time.Second {
		t.Fatalf("interruptible timeout: %+v after %v", r, time.Since(start))
	}
	if r := cell(t, sess, runtime.Python, "x", 0); display(r) != "41" {
		t.Fatalf("state after the timeout: %q %q", display(r), r.Stderr)
	}
	// Code that ignores the interrupt loses the session, and says so.
	r = cell(t, sess, runtime.Python, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", 2*time.Second)
	if !r.TimedOut || !r.SessionLost {
		t.Fatalf("uninterruptible timeout: %+v", r)
	}
	if !sess.Lost() {
		t.Fatal("session not marked lost")
	}
	if _, err := sess.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "x", Limits: limits()}); err == nil {
		t.Fatal("a lost session ran more code")
	}
}

func TestSessionOutOfMemory(t *testing.T) {
	sess := openSession(t)
	cell(t, sess, runtime.Python, "x = 41", 0)
	// gVisor's sandbox is killed as a whole when it passes its memory
	// limit: the session cannot outlive it, and the result says both.
	r := cell(t, sess, runtime.Python, "b = bytearray(400 << 20)", 0)
	if !r.OOMKilled || !r.SessionLost || r.TimedOut {
		t.Fatalf("400 MiB in a 256 MiB session: %+v", r)
	}
	if _, err := sess.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "x", Limits: limits()}); err == nil {
		t.Fatal("a lost session ran more code")
	}
}
