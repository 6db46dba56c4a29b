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

// awaitProxy waits until a TCP connection to the egress proxy at addr
// (IP:port) opens: the NetworkPolicy that lets a networked pod reach it is
// in force. The connection sends nothing; the proxy does not count it.
func awaitProxy(addr string, within time.Duration) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return fmt.Errorf("--egress-proxy %q: want IP:port", addr)
	}
	deadline := time.Now().Add(within)
	for !connects(ap, fenceDialTimeout) {
		if time.Now().After(deadline) {
			return fmt.Errorf("this networked sandbox could not reach the egress proxy at %s within %v: does a NetworkPolicy let networked pods reach airlock's pods on its port (the base's sandboxes-egress-proxy)?", ap, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// connects reports whether a TCP connection to addr opens within
// timeout. Raw system calls, not package net: net would link cgo's
// resolver into a cgo build, and the driver's AllThreadsSyscall (the
// capability drop) refuses to run beside cgo.
func connects(addr netip.AddrPort, timeout time.Duration) bool {
	fd, err := dialFd(addr, timeout)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// failStart reports why the driver will not start where both airlock and
// the operator look: stderr, and the container's termination message.
func failStart(stderr interface{ Write([]byte) (int, error) }, err error) int {
	msg := "airlock-driver: " + err.Error()
	fmt.Fprintln(stderr, msg)
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	return 2
}
