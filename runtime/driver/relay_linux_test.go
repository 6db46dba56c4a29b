package driver

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tagServer answers each connection's first line with tag:line, then
// closes: an egress proxy as far as the relay can tell.
func tagServer(t *testing.T, tag string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = io.WriteString(c, tag+":"+line)
			}()
		}
	}()
	return ln.Addr().String()
}

// through sends line through the relay and returns what came back.
func through(t *testing.T, r *egressRelay, line string) string {
	t.Helper()
	got, err := tryThrough(t, r, line)
	if err != nil {
		t.Fatalf("read through the relay: %v", err)
	}
	return got
}

func tryThrough(t *testing.T, r *egressRelay, line string) (string, error) {
	t.Helper()
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(r.port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

// The relay splices each connection to the upstream it has when the
// connection comes, and a new upstream (a session handed to another
// airlock) takes the next connections.
func TestEgressRelay(t *testing.T) {
	one, two := tagServer(t, "one"), tagServer(t, "two")
	r, err := startRelay("127.0.0.1:0", one)
	if err != nil {
		t.Fatal(err)
	}
	if got := through(t, r, "hi\n"); got != "one:hi\n" {
		t.Errorf("through the first upstream: %q", got)
	}
	if err := r.setUpstream(two); err != nil {
		t.Fatal(err)
	}
	if got := through(t, r, "again\n"); got != "two:again\n" {
		t.Errorf("through the second upstream: %q", got)
	}
	// An address that is none keeps the upstream it had.
	if err := r.setUpstream("proxy.example:3128"); err == nil {
		t.Error("a name as the upstream was taken")
	}
	if got := through(t, r, "still\n"); got != "two:still\n" {
		t.Errorf("after a bad address: %q", got)
	}
	// An upstream that refuses: the code's connection ends, with nothing.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	closed.Close()
	if err := r.setUpstream(gone); err != nil {
		t.Fatal(err)
	}
	// (reset, or closed: the relay read nothing of it).
	if got, err := tryThrough(t, r, "lost\n"); got != "" {
		t.Errorf("with the upstream down: %q (%v), want nothing", got, err)
	}
}

func TestEgressRelayRefusesBadAddresses(t *testing.T) {
	up := tagServer(t, "up")
	for _, c := range []struct{ listen, upstream, want string }{
		{"localhost:3128", up, "want IPv4 address:port"},
		{"[::1]:3128", up, "want IPv4 address:port"},
		{"127.0.0.1:0", "", "want address:port"},
		{"127.0.0.1:0", "proxy:3128", "want address:port"},
	} {
		if _, err := startRelay(c.listen, c.upstream); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("startRelay(%q, %q) = %v, want an error saying %q", c.listen, c.upstream, err, c.want)
		}
	}
}
