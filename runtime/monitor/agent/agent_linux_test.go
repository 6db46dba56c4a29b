package agent

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/airlock-mcp/airlock/runtime/monitor"
)

const token = "0123456789abcdef-test"

// sentry connects to the agent's socket the way runsc's remote sink does
// (handshake, then header + protobuf per event). The listener itself is
// tested against real runsc in runtime/monitor and backend/local.
type sentry struct{ fd int }

func dialSentry(t *testing.T, path string) *sentry {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	hs, _ := proto.Marshal(&pb.Handshake{Version: 1})
	if _, err := unix.Write(fd, hs); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Sec: 10}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if _, err := unix.Read(fd, make([]byte, 1024)); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return &sentry{fd: fd}
}

// mount sends a raw mount(2) enter event of container id (amd64's 165).
func (s *sentry) mount(t *testing.T, id string) {
	t.Helper()
	payload, _ := proto.Marshal(&pb.Syscall{ContextData: &pb.ContextData{ContainerId: id}, Sysno: 165})
	h := make([]byte, 8)
	binary.LittleEndian.PutUint16(h[0:2], 8)
	binary.LittleEndian.PutUint16(h[2:4], uint16(pb.MessageType_MESSAGE_SYSCALL_RAW))
	if _, err := unix.Writev(s.fd, [][]byte{h, payload}); err != nil {
		t.Fatal(err)
	}
}

func newAgent(t *testing.T) (*Agent, *httptest.Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	a, err := New(sock, Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return a, srv, sock
}

func TestAgentTakeAndWatch(t *testing.T) {
	if goruntime.GOARCH != "amd64" {
		t.Skip("the test's mount event uses amd64's syscall number")
	}
	_, srv, sock := newAgent(t)
	c := &Client{Base: srv.URL, Token: token}
	s := dialSentry(t, sock)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A watcher of run-a sees run-a's attempt as it comes, not run-b's.
	ready := make(chan struct{})
	seen := make(chan StreamEvent, 4)
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, "run-a", ready, func(e StreamEvent) { seen <- e }) }()
	<-ready
	s.mount(t, "run-b")
	s.mount(t, "run-a")
	select {
	case e := <-seen:
		if e.Kind != string(monitor.KindMount) || e.Syscall != "mount" {
			t.Errorf("streamed %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not carry run-a's mount")
	}
	s.mount(t, "run-a")
	tr, err := c.Take(ctx, "run-a")
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Synced || len(tr.Attempts) != 1 || tr.Attempts[0].Count != 2 || tr.Attempts[0].Kind != "mount" {
		t.Errorf("take run-a = %+v, want mount x2, synced", tr)
	}
	// Taken means gone; run-b's count is its own.
	if tr, _ := c.Take(ctx, "run-a"); len(tr.Attempts) != 0 {
		t.Errorf("second take = %+v", tr)
	}
	if tr, _ := c.Take(ctx, "run-b"); len(tr.Attempts) != 1 {
		t.Errorf("take run-b = %+v", tr)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch after cancel: %v", err)
	}
}

func TestAgentRefuses(t *testing.T) {
	_, srv, _ := newAgent(t)
	for _, c := range []struct {
		name, method, path, auth string
		want                     int
	}{
		{"no token", "POST", "/v1/containers/run-a/take", "", http.StatusUnauthorized},
		{"wrong token", "POST", "/v1/containers/run-a/take", "Bearer nope", http.StatusUnauthorized},
		{"bad id", "POST", "/v1/containers/..%2Fx/take", "Bearer " + token, http.StatusBadRequest},
		{"long id", "POST", "/v1/containers/" + strings.Repeat("a", 200) + "/take", "Bearer " + token, http.StatusBadRequest},
		{"wrong method", "GET", "/v1/containers/run-a/take", "Bearer " + token, http.StatusMethodNotAllowed},
		{"unknown id is empty", "POST", "/v1/containers/run-a/take", "Bearer " + token, http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("status %d, want %d", resp.StatusCode, c.want)
			}
		})
	}
	if _, err := New(filepath.Join(t.TempDir(), "s"), Options{}); err == nil {
		t.Error("an agent without a token started")
	}
}

// The count of containers no one takes is bounded.
func TestAgentEvicts(t *testing.T) {
	a := &Agent{byID: map[string]*container{}}
	now := time.Now()
	for i := range maxContainers + 10 {
		a.mu.Lock()
		a.containerLocked(strings.Repeat("x", 1+i%100)+string(rune('a'+i%26))+time.Duration(i).String(), now.Add(time.Duration(i)))
		a.mu.Unlock()
	}
	if len(a.byID) > maxContainers {
		t.Errorf("%d containers kept, bound %d", len(a.byID), maxContainers)
	}
}
