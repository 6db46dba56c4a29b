package driver

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// relayDialTimeout bounds one connection's dial of the upstream proxy.
const relayDialTimeout = 10 * time.Second

// egressRelay is a networked session's proxy address inside its sandbox: it
// listens on the sandbox's loopback and splices each connection to the
// egress proxy of the airlock that holds the session now. The code is
// told only the loopback address, so a session handed to another airlock
// (which says so with FrameEgress) keeps its network, whatever the code
// cached. The driver, root in the sandbox, binds it before any code runs;
// the code's user can neither take the port nor signal the driver. Raw
// system calls, not package net (see connects).
type egressRelay struct {
	fd       int
	upstream atomic.Pointer[netip.AddrPort]
}

// startRelay listens on listen (an IPv4 address and port) and relays to
// upstream.
func startRelay(listen, upstream string) (*egressRelay, error) {
	la, err := netip.ParseAddrPort(listen)
	if err != nil || !la.Addr().Is4() {
		return nil, fmt.Errorf("egress relay: listen address %q: want IPv4 address:port", listen)
	}
	r := &egressRelay{}
	if err := r.setUpstream(upstream); err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("egress relay: socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress relay: bind %s: %w", listen, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress relay: listen %s: %w", listen, err)
	}
	r.fd = fd
	go r.serve()
	return r, nil
}

// setUpstream points new connections at addr (IP:port).
func (r *egressRelay) setUpstream(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return fmt.Errorf("egress relay: upstream %q: want address:port", addr)
	}
	r.upstream.Store(&ap)
	return nil
}

// port is the port the relay listens on.
func (r *egressRelay) port() int {
	sa, err := unix.Getsockname(r.fd)
	if err != nil {
		return 0
	}
	if in4, ok := sa.(*unix.SockaddrInet4); ok {
		return in4.Port
	}
	return 0
}

func (r *egressRelay) serve() {
	for {
		cfd, _, err := unix.Accept4(r.fd, unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			return
		}
		go r.splice(cfd)
	}
}

// splice connects to the upstream and copies both ways; a side that ends
// its sending is half-closed on the other, so request-response protocols
// finish.
func (r *egressRelay) splice(cfd int) {
	up, err := dialFd(*r.upstream.Load(), relayDialTimeout)
	if err != nil {
		unix.Close(cfd)
		return
	}
	_ = unix.SetNonblock(cfd, true)
	client, upstream := os.NewFile(uintptr(cfd), "relay-client"), os.NewFile(uintptr(up), "relay-upstream")
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(upstream, client)
		_ = unix.Shutdown(up, unix.SHUT_WR)
		close(done)
	}()
	_, _ = io.Copy(client, upstream)
	_ = unix.Shutdown(cfd, unix.SHUT_WR)
	<-done
	client.Close()
	upstream.Close()
}

// dialFd opens a TCP connection to addr within timeout and returns its
// non-blocking socket.
func dialFd(addr netip.AddrPort, timeout time.Duration) (int, error) {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if addr.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	err = unix.Connect(fd, sa)
	if errors.Is(err, unix.EINPROGRESS) {
		err = waitConnected(fd, timeout)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// waitConnected waits for a non-blocking connect on fd to finish.
func waitConnected(fd int, timeout time.Duration) error {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds, int(timeout.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return unix.ETIMEDOUT
		}
		break
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return err
	}
	if soErr != 0 {
		return unix.Errno(soErr)
	}
	return nil
}
