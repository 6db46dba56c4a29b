package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/tools"
)

// echoRuntime answers every run with its code and who asked, so the test
// can see the relay carried the call and the daemon named the peer.
type echoRuntime struct{ last chan runtime.Request }

func (e *echoRuntime) Run(_ context.Context, r runtime.Request) (runtime.Result, error) {
	e.last <- r
	return runtime.Result{RunID: r.RunID, Stdout: "echo: " + r.Code}, nil
}
func (e *echoRuntime) Close(context.Context) error { return nil }

// The relay carries a stdio session to the daemon's socket and back; the
// daemon names the caller by SO_PEERCRED.
func TestRelayOverSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own the socket") // CI runs as root
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	rt := &echoRuntime{last: make(chan runtime.Request, 1)}
	h := &tools.Handlers{Manager: rt, Limits: config.Defaults().Limits, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	srv, err := NewHTTP(New("test", h), HTTPOptions{Socket: sock, SocketGroup: "airlock", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- Relay(t.Context(), inR, outW, RelayOptions{Socket: sock}) }()
	out := bufio.NewReader(outR)
	send := func(s string) {
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() map[string]any {
		t.Helper()
		line := make(chan string, 1)
		go func() { l, _ := out.ReadString('\n'); line <- l }()
		select {
		case l := <-line:
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("relay wrote %q: %v", l, err)
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no answer from the relay")
			return nil
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`)
	if init := recv(); init["result"] == nil {
		t.Fatalf("initialize: %v", init)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_shell","arguments":{"command":"echo hi"}}}`)
	res := recv()
	b, _ := json.Marshal(res)
	if !strings.Contains(string(b), "echo: echo hi") {
		t.Fatalf("tools/call through the relay: %s", b)
	}
	select {
	case <-rt.last:
	default:
		t.Fatal("the runtime was not reached")
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("relay ended with %v", err)
	}
}

// A daemon that is not there: the client gets an answer that says what to
// check, not silence.
func TestRelayNoDaemon(t *testing.T) {
	inR, inW := io.Pipe()
	var out strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- Relay(t.Context(), inR, &syncWriter{w: &out}, RelayOptions{Socket: filepath.Join(t.TempDir(), "none.sock"), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	_, _ = io.WriteString(inW, `{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}`+"\n")
	inW.Close()
	<-done
	if s := out.String(); !strings.Contains(s, `"id":7`) || !strings.Contains(s, "cannot reach the airlock daemon") || !strings.Contains(s, "server.socket_group") {
		t.Errorf("relay answered %q", s)
	}
}

type syncWriter struct{ w io.Writer }

func (s *syncWriter) Write(p []byte) (int, error) { return s.w.Write(p) }
