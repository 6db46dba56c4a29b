package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// RelayOptions say where `airlock connect` relays to.
type RelayOptions struct {
	// Socket is the daemon's Unix socket.
	Socket string
	Log    *slog.Logger
}

// relay copies one stdio MCP session to the daemon's streamable HTTP
// endpoint and back. It is what lets an unprivileged desktop client use a
// root daemon: the client starts `airlock connect` as its stdio server, and
// every message goes over the socket, where the daemon names the user by
// SO_PEERCRED. Requests go out concurrently, so a cancellation can pass a
// long call; everything the daemon sends back (responses, progress,
// elicitation requests) is written to stdout one line at a time.
type relay struct {
	o      RelayOptions
	client *http.Client
	url    string
	out    io.Writer
	outMu  sync.Mutex

	mu      sync.Mutex
	session string
	version string
}

// Relay runs until in ends or ctx is done.
func Relay(ctx context.Context, in io.Reader, out io.Writer, o RelayOptions) error {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	r := &relay{o: o, out: out, url: "http://airlock/mcp"}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	r.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", o.Socket)
		},
		// One connection per call in flight: closing it is how a call is
		// abandoned when the relay goes away.
		MaxConnsPerHost: 0,
	}}
	defer r.close()
	br := bufio.NewReaderSize(in, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			r.dispatch(ctx, bytes.TrimSpace(line))
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read stdin: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// message is what the relay needs to know of a JSON-RPC message.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
}

func (r *relay) dispatch(ctx context.Context, line []byte) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		r.write(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":%q}}`, "parse error: "+err.Error()))
		return
	}
	isRequest := m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null"
	if !isRequest || m.Method == "initialize" {
		// Notifications and responses are quick and keep their order;
		// initialize must finish before anything uses its session.
		r.post(ctx, line, m)
		return
	}
	go r.post(ctx, line, m)
}

func (r *relay) post(ctx context.Context, body []byte, m message) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		r.fail(m, err.Error())
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	r.mu.Lock()
	if r.session != "" {
		req.Header.Set("Mcp-Session-Id", r.session)
	}
	if r.version != "" {
		req.Header.Set("Mcp-Protocol-Version", r.version)
	}
	r.mu.Unlock()
	resp, err := r.client.Do(req)
	if err != nil {
		r.fail(m, fmt.Sprintf("cannot reach the airlock daemon at %s: %v. Is `airlock serve` running (systemctl status airlock), and is your user in its socket group (server.socket_group)?", r.o.Socket, err))
		return
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		r.mu.Lock()
		r.session = id
		r.mu.Unlock()
	}
	if resp.StatusCode == http.StatusAccepted {
		return
	}
	ctype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode >= 300:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.fail(m, fmt.Sprintf("the airlock daemon refused the message (HTTP %d): %s", resp.StatusCode, strings.TrimSpace(string(b))))
	case ctype == "text/event-stream":
		r.copyEvents(resp.Body, m)
	default:
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			r.fail(m, fmt.Sprintf("reading the daemon's answer: %v", err))
			return
		}
		r.deliver(bytes.TrimSpace(b), m)
	}
}

// copyEvents writes each server-sent event's data as one message.
func (r *relay) copyEvents(body io.Reader, m message) {
	sc := bufio.NewScanner(body)
	// A read_file of the largest file comes back twice (text and
	// structuredContent), base64-encoded when binary.
	sc.Buffer(make([]byte, 64<<10), 96<<20)
	var data []byte
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			if len(data) > 0 {
				r.deliver(data, m)
				data = nil
			}
		case bytes.HasPrefix(line, []byte("data:")):
			chunk := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, chunk...)
		}
	}
	if len(data) > 0 {
		r.deliver(data, m)
	}
}

// deliver writes one message from the daemon, learning the protocol
// version from the answer to initialize.
func (r *relay) deliver(b []byte, m message) {
	if len(b) == 0 {
		return
	}
	if m.Method == "initialize" {
		var res struct {
			Result struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"result"`
		}
		if json.Unmarshal(b, &res) == nil && res.Result.ProtocolVersion != "" {
			r.mu.Lock()
			r.version = res.Result.ProtocolVersion
			r.mu.Unlock()
		}
	}
	r.write(b)
}

// fail answers a request the daemon could not, so the client is not left
// waiting; a failed notification is only logged.
func (r *relay) fail(m message, msg string) {
	r.o.Log.Warn("relay", "method", m.Method, "err", msg)
	if m.Method == "" || len(m.ID) == 0 {
		return
	}
	r.write(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":%q}}`, m.ID, msg))
}

func (r *relay) write(b []byte) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	_, _ = r.out.Write(append(append([]byte(nil), b...), '\n'))
}

// close ends the session. Calls still in flight are abandoned: the process
// exits, their connections close, and the daemon cancels them.
func (r *relay) close() {
	r.mu.Lock()
	session := r.session
	r.mu.Unlock()
	if session != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if req, err := http.NewRequestWithContext(ctx, http.MethodDelete, r.url, nil); err == nil {
			req.Header.Set("Mcp-Session-Id", session)
			if resp, err := r.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}
	r.client.CloseIdleConnections()
}
