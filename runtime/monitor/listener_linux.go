package monitor

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

const (
	// handshakeTimeout bounds the wait for a new connection's handshake,
	// so a peer that connects and says nothing cannot hold a connection
	// slot. runsc sends its handshake right after connect. After the
	// handshake there is no deadline: runsc keeps the connection for the
	// sandbox's whole life and may be silent for hours.
	handshakeTimeout = 10 * time.Second
	// maxHandshake bounds the handshake message; runsc's is 2 bytes.
	maxHandshake = 1024
)

var errTruncated = errors.New("message truncated (longer than the maximum)")

// Listener is the remote sink endpoint for runsc's trace sessions: one
// SOCK_SEQPACKET connection per sandbox.
type Listener struct {
	ln   *net.UnixListener
	path string
	opts Options
	log  *slog.Logger
	sem  chan struct{}
	done chan struct{}

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Listen creates the socket at path (mode 0600, replacing a stale socket
// file left by a previous run) and starts accepting sandbox connections.
// The caller should put path in a directory only airlock can enter; Close
// stops everything.
func Listen(path string, opts Options) (*Listener, error) {
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	logger := opts.Log
	if logger == nil {
		logger = slog.Default()
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := listenSeqpacket(path)
	if err != nil {
		return nil, err
	}
	l := &Listener{
		ln:    ln,
		path:  path,
		opts:  opts,
		log:   logger.With("component", "monitor", "socket", path),
		sem:   make(chan struct{}, opts.MaxConns),
		done:  make(chan struct{}),
		conns: make(map[*conn]struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Path returns the socket path, the endpoint to put in [Config].
func (l *Listener) Path() string { return l.path }

// removeStale removes a socket file that no process listens on any more.
// Anything else at path (a regular file, a live socket) is an error rather
// than something to delete.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("monitor socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("monitor socket %s: exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unixpacket", path, time.Second); err == nil {
		_ = c.Close()
		return fmt.Errorf("monitor socket %s: another process is listening on it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale monitor socket: %w", err)
	}
	return nil
}

// listenSeqpacket binds a SOCK_SEQPACKET socket whose file is created with
// mode 0600. net.ListenUnix would create it with the umask's mode and leave
// a window before a chmod in which another local user could connect and
// inject events; Linux instead creates the file with the mode of the
// unbound socket's inode, which fchmod sets.
func listenSeqpacket(path string) (*net.UnixListener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // net.FileListener dups it.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("monitor socket: fchmod: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, fmt.Errorf("monitor socket: bind %s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(path)
		}
	}()
	// Belt and braces, for kernels that ignore the inode mode at bind.
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return nil, fmt.Errorf("monitor socket: listen: %w", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	ul, isUnix := ln.(*net.UnixListener)
	if !isUnix {
		_ = ln.Close()
		return nil, fmt.Errorf("monitor socket: unexpected listener type %T", ln)
	}
	ok = true
	return ul, nil
}

// Close stops accepting, closes every sandbox connection (which unblocks
// their reads), waits for all goroutines to return and removes the socket
// file. runsc does not reconnect: sandboxes that outlive Close run unwatched
// (their sink writes fail and are counted as drops inside the sandbox).
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		conns := make([]*conn, 0, len(l.conns))
		for c := range l.conns {
			conns = append(conns, c)
		}
		l.mu.Unlock()
		close(l.done)
		if err := l.ln.Close(); err != nil {
			l.closeErr = fmt.Errorf("closing monitor socket: %w", err)
		}
		for _, c := range conns {
			_ = c.c.Close()
		}
		l.wg.Wait()
		if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) && l.closeErr == nil {
			l.closeErr = fmt.Errorf("removing monitor socket: %w", err)
		}
	})
	return l.closeErr
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: wait a little rather than spin, but
			// stay responsive to Close.
			l.log.Warn("runtime monitor: accept failed", "err", err)
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		select {
		case l.sem <- struct{}{}:
		default:
			l.log.Warn("runtime monitor: too many sandbox connections, refusing one", "max", l.opts.MaxConns)
			_ = c.Close()
			continue
		}
		cn, err := l.track(c)
		if err != nil {
			l.log.Warn("runtime monitor: refusing a connection", "err", err)
			_ = c.Close()
			<-l.sem
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go l.serve(cn)
	}
}

// conn is one sandbox's connection.
type conn struct {
	c  *net.UnixConn
	rc syscall.RawConn

	// mu guards busy and ids. busy is true from just before a message is
	// taken off the socket until it has been delivered, so that "not busy
	// and nothing queued" means every message sent so far was delivered
	// (see Sync).
	mu   sync.Mutex
	busy bool
	ids  map[string]struct{} // container ids seen, at most maxIDsPerConn
}

// maxIDsPerConn bounds the container ids remembered per connection (a
// sandbox holds one container locally, a few in a Kubernetes pod).
const maxIDsPerConn = 16

func (cn *conn) setBusy(b bool) {
	cn.mu.Lock()
	cn.busy = b
	cn.mu.Unlock()
}

func (cn *conn) noteID(id string) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if _, ok := cn.ids[id]; !ok && len(cn.ids) < maxIDsPerConn {
		cn.ids[id] = struct{}{}
	}
}

// track registers c so Close can close it; net.ErrClosed once Close has
// begun.
func (l *Listener) track(c *net.UnixConn) (*conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("monitor connection: %w", err)
	}
	cn := &conn{c: c, rc: rc, ids: map[string]struct{}{}}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, net.ErrClosed
	}
	l.conns[cn] = struct{}{}
	l.wg.Add(1)
	return cn, nil
}

// Sync waits until every event the sandbox running containerID has written
// to its connection so far has been delivered to Options.OnEvent, or until
// timeout; it reports whether it got there. runsc's sink writes each event
// synchronously in the syscall that caused it, so once the sandboxed
// process has exited (or a run's code has returned), Sync makes the
// attempts counted for it complete. Connections that have not sent a
// container id yet are waited for too, since they might be that sandbox's.
func (l *Listener) Sync(containerID string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if l.drained(containerID) {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		select {
		case <-l.done:
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (l *Listener) drained(containerID string) bool {
	l.mu.Lock()
	conns := make([]*conn, 0, len(l.conns))
	for cn := range l.conns {
		conns = append(conns, cn)
	}
	l.mu.Unlock()
	for _, cn := range conns {
		if !cn.drained(containerID) {
			return false
		}
	}
	return true
}

func (cn *conn) drained(containerID string) bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if _, mine := cn.ids[containerID]; !mine && len(cn.ids) > 0 {
		return true
	}
	if cn.busy {
		return false
	}
	// With mu held the reader cannot start taking a message, so an empty
	// receive queue now means nothing from this sandbox is pending. For a
	// SOCK_SEQPACKET socket SIOCINQ is the length of the first queued
	// message, 0 if none.
	queued := 0
	err := cn.rc.Control(func(fd uintptr) {
		queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return err != nil || queued == 0
}

func (l *Listener) serve(cn *conn) {
	c := cn.c
	var cid string
	err := l.handshake(c)
	if err == nil {
		err = l.readLoop(cn, &cid)
	}
	l.mu.Lock()
	delete(l.conns, cn)
	closing := l.closed
	l.mu.Unlock()
	_ = c.Close()
	if closing && errors.Is(err, net.ErrClosed) {
		err = nil
	}
	if err != nil {
		l.log.Warn("runtime monitor: sandbox connection failed; events from this sandbox are no longer seen",
			"container_id", cid, "err", err)
	}
	if l.opts.OnConnClosed != nil {
		l.opts.OnConnClosed(cid, err)
	}
	<-l.sem
	l.wg.Done()
}

// handshake reads the client's Handshake and answers with ours, as runsc's
// remote sink expects (pkg/sentry/seccheck/sinks/remote/remote.go, setup):
// this is the only message the server ever writes.
func (l *Listener) handshake(c *net.UnixConn) error {
	if err := c.SetReadDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	buf := make([]byte, maxHandshake)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return fmt.Errorf("handshake: reading: %w", err)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return errors.New("handshake: message too large")
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(buf[:n], &hs); err != nil {
		return fmt.Errorf("handshake: decoding: %w", err)
	}
	if hs.GetVersion() != wireVersion {
		// A newer runsc may frame or encode differently: refuse (which
		// fails the sandbox's creation) rather than misread its events.
		return fmt.Errorf("handshake: unsupported protocol version %d (want %d)", hs.GetVersion(), wireVersion)
	}
	out, err := proto.Marshal(&pb.Handshake{Version: wireVersion})
	if err != nil {
		return fmt.Errorf("handshake: encoding: %w", err)
	}
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("handshake: writing: %w", err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	return nil
}

// readLoop reads messages until the peer closes (nil) or a read fails.
func (l *Listener) readLoop(cn *conn, cid *string) error {
	buf := make([]byte, MaxMessageSize)
	var lastDropped uint32
	for {
		n, flags, err := cn.recv(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			// End of stream: runsc closed the sink (sandbox gone).
			// runsc never sends an empty message.
			return nil
		}
		l.handle(cn, buf, n, flags, cid, &lastDropped)
		cn.setBusy(false)
	}
}

// recv takes one message off the socket, marking cn busy first (see conn).
// It waits through Go's poller, so closing the connection unblocks it.
func (cn *conn) recv(buf []byte) (n, flags int, err error) {
	var rerr error
	err = cn.rc.Read(func(fd uintptr) bool {
		cn.setBusy(true)
		for {
			n, _, flags, _, rerr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			cn.setBusy(false)
			return false // wait until readable
		}
		return true
	})
	if err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		cn.setBusy(false)
		return 0, 0, fmt.Errorf("reading event: %w", err)
	}
	return n, flags, nil
}

// handle parses, classifies and delivers one message.
func (l *Listener) handle(cn *conn, buf []byte, n, flags int, cid *string, lastDropped *uint32) {
	if flags&unix.MSG_TRUNC != 0 {
		l.malformed(*cid, errTruncated)
		return
	}
	h, msg, err := ParseMessage(buf[:n])
	id := containerID(msg)
	if id != "" {
		*cid = id
		cn.noteID(id)
	}
	if h.HeaderSize >= headerSize && int(h.HeaderSize) <= n {
		// The sink's counter is cumulative and wraps at 2^32; unsigned
		// subtraction gives the delta across a wrap.
		if delta := h.DroppedCount - *lastDropped; delta != 0 {
			*lastDropped = h.DroppedCount
			if l.opts.OnDropped != nil {
				l.opts.OnDropped(*cid, uint64(delta))
			}
		}
	}
	if err != nil {
		l.malformed(*cid, err)
		return
	}
	if msg == nil {
		return
	}
	kind, sc, detail, ok := Classify(pb.MessageType(h.MessageType), msg)
	if ok && l.opts.OnEvent != nil {
		l.opts.OnEvent(Event{ContainerID: id, Kind: kind, Syscall: sc, Detail: detail})
	}
}

func (l *Listener) malformed(cid string, err error) {
	if l.opts.OnMalformed != nil {
		l.opts.OnMalformed(cid, err)
	}
}
