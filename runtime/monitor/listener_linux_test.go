package monitor

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// sockPath returns a short socket path (sun_path is limited to 108 bytes,
// which t.TempDir can exceed).
func sockPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mon")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s")
}

// dialRaw connects like runsc's remote sink (remote.setup) without the
// handshake.
func dialRaw(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	// Bound every read in the test so a bug fails instead of hanging.
	tv := unix.Timeval{Sec: 10}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd
}

// dial performs runsc's handshake: write Handshake{Version: 1}, read the
// server's into a 10240-byte buffer, require version >= 1.
func dial(t *testing.T, path string) int {
	t.Helper()
	fd := dialRaw(t, path)
	out, err := proto.Marshal(&pb.Handshake{Version: wireVersion})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, out); err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 10240)
	n, err := unix.Read(fd, in)
	if err != nil {
		t.Fatalf("reading handshake: %v", err)
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(in[:n], &hs); err != nil || hs.GetVersion() < 1 {
		t.Fatalf("server handshake %v (%v)", hs.GetVersion(), err)
	}
	return fd
}

// send writes a header and payload in one writev, as remote.write does.
func send(t *testing.T, fd int, b []byte) {
	t.Helper()
	if _, err := unix.Writev(fd, [][]byte{b[:headerSize], b[headerSize:]}); err != nil {
		t.Fatal(err)
	}
}

// expectClosed asserts the server closed the connection.
func expectClosed(t *testing.T, fd int) {
	t.Helper()
	buf := make([]byte, 64)
	n, err := unix.Read(fd, buf)
	if errors.Is(err, unix.ECONNRESET) {
		return // closed with data still queued on the server's side
	}
	if err != nil {
		t.Fatalf("read: %v (want EOF)", err)
	}
	if n != 0 {
		t.Fatalf("read %d bytes, want EOF", n)
	}
}

type recorder struct {
	mu        sync.Mutex
	events    []Event
	dropped   map[string]uint64
	malformed int
	closed    int
}

func (r *recorder) options() Options {
	r.dropped = map[string]uint64{}
	return Options{
		OnEvent: func(e Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() },
		OnDropped: func(id string, n uint64) {
			r.mu.Lock()
			r.dropped[id] += n
			r.mu.Unlock()
		},
		OnMalformed:  func(string, error) { r.mu.Lock(); r.malformed++; r.mu.Unlock() },
		OnConnClosed: func(string, error) { r.mu.Lock(); r.closed++; r.mu.Unlock() },
		Log:          slog.New(slog.DiscardHandler),
	}
}

// waitFor polls cond with a bounded wait.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestListenerEndToEnd(t *testing.T) {
	if hostArch != archTables["amd64"] {
		t.Skip("test events use amd64 syscall numbers")
	}
	base := runtime.NumGoroutine()
	path := sockPath(t)
	var rec recorder
	l, err := Listen(path, rec.options())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want socket 0600", fi.Mode())
	}

	a := dial(t, path)
	b := dial(t, path)
	ca, cb := ctx("sandbox-a"), ctx("sandbox-b")
	// Sandbox A: a mount, a benign open, a refused write, an ignored type,
	// a malformed payload, a truncated (oversized) message, then drops.
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{ContextData: ca, Sysno: 165}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: ca, Sysno: 257, Pathname: "/etc/hosts", Exit: exit(0)}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: ca, Sysno: 257, Pathname: "/usr/x", Flags: oWRONLY | oCREAT, Exit: exit(errEROFS)}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SENTRY_TASK_EXIT, 0, &pb.TaskExit{ContextData: ca}))
	send(t, a, frameRaw(headerSize, uint16(pb.MessageType_MESSAGE_SYSCALL_RAW), 0, nil, []byte{0xff, 0xff, 0xff}))
	send(t, a, frameRaw(headerSize, uint16(pb.MessageType_MESSAGE_SYSCALL_RAW), 0, nil, make([]byte, MaxMessageSize)))
	send(t, a, frameRaw(2, uint16(pb.MessageType_MESSAGE_SYSCALL_RAW), 0, nil, []byte{1}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_PTRACE, 3, &pb.Ptrace{ContextData: ca, Sysno: 101}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 3, &pb.Open{ContextData: ca, Sysno: 257}))
	send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 5, &pb.Open{ContextData: ca, Sysno: 257}))
	// A newer, longer header is skipped over.
	send(t, a, frameRaw(12, uint16(pb.MessageType_MESSAGE_SYSCALL_CHROOT), 5, []byte{9, 9, 9, 9}, mustMarshal(t, &pb.Chroot{ContextData: ca, Sysno: 161, Pathname: "/tmp"})))
	// Sandbox B: its dropped counter wraps around.
	send(t, b, frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 0xfffffffe, &pb.Open{ContextData: cb, Sysno: 257}))
	send(t, b, frame(t, pb.MessageType_MESSAGE_SYSCALL_SOCKET, 1, &pb.Socket{ContextData: cb, Sysno: 41, Domain: afPACKET, Type: sockRAW}))

	waitFor(t, "events", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.events) == 5 && rec.malformed == 3 && rec.dropped["sandbox-a"] == 5 && rec.dropped["sandbox-b"] == 0xfffffffe+3
	})
	rec.mu.Lock()
	got := map[string][]Kind{}
	for _, e := range rec.events {
		got[e.ContainerID] = append(got[e.ContainerID], e.Kind)
	}
	rec.mu.Unlock()
	wantA := []Kind{KindMount, KindReadonlyWrite, KindPtrace, KindPrivilege}
	if len(got["sandbox-a"]) != len(wantA) || len(got["sandbox-b"]) != 1 || got["sandbox-b"][0] != KindRawSocket {
		t.Fatalf("events %v", got)
	}
	for i, k := range wantA {
		if got["sandbox-a"][i] != k {
			t.Fatalf("sandbox-a events %v, want %v", got["sandbox-a"], wantA)
		}
	}

	// runsc closing its end (the sandbox exited) ends that connection only.
	unix.Close(b)
	waitFor(t, "close of b", func() bool { rec.mu.Lock(); defer rec.mu.Unlock(); return rec.closed == 1 })

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, a)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("socket file left behind: %v", err)
	}
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= base })
}

func TestListenerBadHandshakes(t *testing.T) {
	path := sockPath(t)
	var rec recorder
	l, err := Listen(path, rec.options())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for name, hs := range map[string][]byte{
		"garbage":   {0xff, 0xff, 0xff, 0xff},
		"version 0": {},
		"version 2": mustMarshal(t, &pb.Handshake{Version: 2}),
		"too large": make([]byte, maxHandshake+1),
		"an event":  frame(t, pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{Sysno: 165}),
	} {
		t.Run(name, func(t *testing.T) {
			fd := dialRaw(t, path)
			if len(hs) == 0 {
				// An empty seqpacket message decodes as version 0.
				if _, err := unix.SendmsgN(fd, nil, nil, nil, 0); err != nil {
					t.Fatal(err)
				}
			} else if _, err := unix.Write(fd, hs); err != nil {
				t.Fatal(err)
			}
			expectClosed(t, fd)
		})
	}
	if len(rec.events) != 0 {
		t.Errorf("events from refused connections: %v", rec.events)
	}
}

func TestListenerCloseUnblocksIdleConnections(t *testing.T) {
	base := runtime.NumGoroutine()
	path := sockPath(t)
	l, err := Listen(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for range 5 {
		fds = append(fds, dial(t, path))
	}
	// One more that never finishes its handshake.
	silent := dialRaw(t, path)
	done := make(chan error, 1)
	go func() { done <- l.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked")
	}
	for _, fd := range append(fds, silent) {
		expectClosed(t, fd)
	}
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= base })
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestListenerMaxConns(t *testing.T) {
	path := sockPath(t)
	var rec recorder
	opts := rec.options()
	opts.MaxConns = 1
	l, err := Listen(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first := dial(t, path)
	expectClosed(t, dialRaw(t, path))
	// The slot frees when the first sandbox goes away.
	unix.Close(first)
	waitFor(t, "first connection to end", func() bool { rec.mu.Lock(); defer rec.mu.Unlock(); return rec.closed == 1 })
	dial(t, path)
}

func TestListenStaleSocket(t *testing.T) {
	path := sockPath(t)
	// A socket file nobody listens on, as a crashed airlock leaves it.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	l, err := Listen(path, Options{})
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	// A live listener is not replaced.
	if _, err := Listen(path, Options{}); err == nil {
		t.Fatal("second listener on a live socket")
	}
	dial(t, path)
	l.Close()

	// Nor is something that is not a socket.
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, Options{}); err == nil {
		t.Fatal("listened over a regular file")
	}
}

func TestListenerSync(t *testing.T) {
	if hostArch != archTables["amd64"] {
		t.Skip("test events use amd64 syscall numbers")
	}
	path := sockPath(t)
	var rec recorder
	opts := rec.options()
	release := make(chan struct{})
	inner := opts.OnEvent
	// A slow consumer: Sync must wait for delivery, not just for the read.
	opts.OnEvent = func(e Event) { <-release; inner(e) }
	l, err := Listen(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := dial(t, path)
	const n = 50
	for range n {
		send(t, a, frame(t, pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{ContextData: ctx("a"), Sysno: 165}))
	}
	if l.Sync("a", 50*time.Millisecond) {
		t.Fatal("Sync returned while deliveries were blocked")
	}
	close(release)
	if !l.Sync("a", 10*time.Second) {
		t.Fatal("Sync timed out")
	}
	rec.mu.Lock()
	got := len(rec.events)
	rec.mu.Unlock()
	if got != n {
		t.Fatalf("%d events delivered after Sync, want %d", got, n)
	}
	// Another container's connection does not hold up Sync.
	b := dial(t, path)
	send(t, b, frame(t, pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{ContextData: ctx("b"), Sysno: 165}))
	if !l.Sync("b", 10*time.Second) || !l.Sync("a", 10*time.Second) {
		t.Fatal("Sync timed out")
	}
}
