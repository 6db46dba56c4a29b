package driver

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestAwaitFence(t *testing.T) {
	open, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	go func() {
		for {
			c, err := open.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	_ = closed.Close()

	for _, c := range []struct {
		name       string
		host, port string
		wantErr    string
	}{
		{"nothing to probe", "", "", "no KUBERNETES_SERVICE_HOST/PORT"},
		{"the API server answers: not fenced", "127.0.0.1", portOf(open), "nothing enforces"},
		{"the API server is cut off: fenced", "127.0.0.1", strconv.Itoa(closedPort), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", c.host)
			t.Setenv("KUBERNETES_SERVICE_PORT", c.port)
			err := awaitFence(300 * time.Millisecond)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("err = %v, want it to say %q", err, c.wantErr)
			}
		})
	}
}

func portOf(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }

func TestAwaitProxy(t *testing.T) {
	open, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	_ = closed.Close()
	for _, c := range []struct{ name, addr, wantErr string }{
		{"reachable", open.Addr().String(), ""},
		{"unreachable", gone, "could not reach the egress proxy"},
		{"a name", "proxy.airlock:3128", "want IP:port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := awaitProxy(c.addr, 300*time.Millisecond)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("err = %v, want it to say %q", err, c.wantErr)
			}
		})
	}
}
