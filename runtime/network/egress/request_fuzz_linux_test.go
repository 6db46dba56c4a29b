package egress

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// FuzzProxyRequest sends arbitrary bytes to the proxy as a registered
// sandbox would: a request head, perhaps a ClientHello after a CONNECT,
// perhaps garbage. Whatever they are, the proxy must not panic, must answer
// or close within its timeouts, and must never dial anything but the one
// allowed destination (allowed.test, pinned to 127.0.0.1, ports 80 and 443).
//
//	go test -run '^$' -fuzz '^FuzzProxyRequest$' -fuzztime 5m ./runtime/network/egress
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n\x16\x03\x01\x00\x05hello",
		"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n",
		"GET http://[::ffff:127.0.0.1]:80/ HTTP/1.1\r\n\r\n",
		"GET http://other.test@allowed.test/ HTTP/1.1\r\n\r\n",
		"GET /relative HTTP/1.1\r\n\r\n",
		"POST http://allowed.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"CONNECT allowed.test:22 HTTP/1.1\r\n\r\nSSH-2.0-x\r\n",
		"\x16\x03\x01\x02\x00\x01",
	} {
		f.Add([]byte(s))
	}
	h := newHarness(f, Options{HeaderTimeout: 300 * time.Millisecond, HelloTimeout: 300 * time.Millisecond, DialTimeout: 300 * time.Millisecond})
	p, err := ParsePolicy([]string{"allowed.test"}, []int{80, 443}, nil)
	if err != nil {
		f.Fatal(err)
	}
	h.srv.Register(netip.MustParseAddr("127.0.0.9"), "fuzz", p)
	// Tens of thousands of connections from one source address: the port
	// is chosen at connect time (IP_BIND_ADDRESS_NO_PORT), where the kernel
	// may reuse the TIME_WAIT ports these half-closes leave, instead of at
	// bind time, where it runs out of them.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}, Timeout: 2 * time.Second,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
			}); err != nil {
				return err
			}
			return serr
		}}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := d.Dial("tcp", h.addr)
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Skipf("this host is out of ports for 127.0.0.9: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write(data)
		_ = c.(*net.TCPConn).CloseWrite()
		if _, err := io.Copy(io.Discard, c); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("the proxy neither answered nor closed: %v", err)
		}
		for _, a := range h.dials() {
			if a != "127.0.0.1:80" && a != "127.0.0.1:443" {
				t.Fatalf("the proxy dialed %q for input %q", a, data)
			}
		}
	})
}
