package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// fenceDialTimeout is one probe's connect timeout: a policy that drops
// (rather than refuses) answers with silence.
const fenceDialTimeout = 500 * time.Millisecond

// FenceWait is how long a networked sandbox waits for its NetworkPolicy
// before it gives up.
const FenceWait = 30 * time.Second

// awaitFence waits until a TCP connection to the cluster's API server
// (the address every pod is told of) fails: the NetworkPolicy that cuts a
// networked sandbox off is in force. An enforcer programs a new pod's
// rules a moment after the pod has its address, and no code may run in
// that moment.
func awaitFence(within time.Duration) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return errors.New("no KUBERNETES_SERVICE_HOST/PORT to probe the sandbox's NetworkPolicy with")
	}
	ip, err := netip.ParseAddr(host)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT %q %q: not an address and port", host, port)
	}
	addr := netip.AddrPortFrom(ip, uint16(p))
	deadline := time.Now().Add(within)
	for {
		if !connects(addr, fenceDialTimeout) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("this networked sandbox still reached the API server at %s after %v: nothing enforces the sandbox namespace's deny-all NetworkPolicy", addr, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connects reports whether a TCP connection to addr opens within
// timeout. Raw system calls, not package net: net would link cgo's
// resolver into a cgo build, and the driver's AllThreadsSyscall (the
// capability drop) refuses to run beside cgo.
func connects(addr netip.AddrPort, timeout time.Duration) bool {
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
		return false
	}
	defer unix.Close(fd)
	switch err := unix.Connect(fd, sa); {
	case err == nil:
		return true
	case !errors.Is(err, unix.EINPROGRESS):
		return false
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds, int(timeout.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		break
	}
	soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	return err == nil && soErr == 0
}

// failStart reports why the driver will not start where both airlock and
// the operator look: stderr, and the container's termination message.
func failStart(stderr interface{ Write([]byte) (int, error) }, err error) int {
	msg := "airlock-driver: " + err.Error()
	fmt.Fprintln(stderr, msg)
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	return 2
}
