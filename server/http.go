package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/tools"
)

// Transports served over HTTP.
const (
	TransportHTTP = "http" // streamable HTTP at /mcp
	TransportSSE  = "sse"  // legacy SSE at /sse and /message
)

// defaultMaxBody bounds a JSON-RPC message posted to airlock when
// HTTPOptions.MaxBody does not: code is capped far below it.
const defaultMaxBody = 8 << 20

// HTTPOptions configure the HTTP transports.
type HTTPOptions struct {
	// Listen is the TCP address; empty: no TCP listener.
	Listen string
	// Transports are TransportHTTP and/or TransportSSE.
	Transports []string
	// Socket is a Unix socket path served without tokens, to local peers
	// identified by SO_PEERCRED; empty: none.
	Socket      string
	SocketGroup string
	TLSCert     string
	TLSKey      string
	// Tokens authenticate TCP clients. While it is nil or empty, clients go
	// unauthenticated, which is allowed on loopback only, or with
	// AllowUnauthenticated.
	Tokens               *Tokens
	AllowUnauthenticated bool
	// AllowedOrigins are browser origins allowed besides the server's own.
	AllowedOrigins []string
	// Ready reports whether the sandbox runtime can serve (for /readyz).
	Ready func(context.Context) error
	// Extra handlers mounted on the TCP listener, e.g. /metrics.
	Extra map[string]http.Handler
	// MaxBody bounds a posted message; zero: 8 MiB. A write_file of the
	// largest allowed file, base64-encoded, must fit.
	MaxBody int64
	// SessionKey, shared by replicas behind one Service, lets any of them
	// serve a streamable HTTP session another opened (for its owner only);
	// nil: sessions stay where they began.
	SessionKey []byte
	// Peers lists the other replicas' MCP addresses (host:port), to which
	// a 2025-11-25 client's reply this replica cannot place is handed
	// (forward.go); nil: this process is alone.
	Peers func(context.Context) ([]string, error)
	Log   *slog.Logger
}

// HTTPServer is airlock's network face: the MCP transports, health
// endpoints, and the local Unix socket.
type HTTPServer struct {
	o       HTTPOptions
	mcp     *server.MCPServer
	owners  *owners
	sse     *server.SSEServer
	servers []*http.Server
	addrs   []net.Addr
	wg      sync.WaitGroup
	// active counts requests being answered, streams aside, so shutdown
	// can let the last answers out before it drops connections.
	active sync.WaitGroup
}

// NewHTTP checks o and builds the server; Start listens.
func NewHTTP(s *server.MCPServer, o HTTPOptions) (*HTTPServer, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	for _, t := range o.Transports {
		if t != TransportHTTP && t != TransportSSE {
			return nil, fmt.Errorf("transport %q: use http, sse or both", t)
		}
	}
	if o.Listen != "" {
		if err := CheckExposure(o.Listen, o.Tokens, o.AllowUnauthenticated); err != nil {
			return nil, err
		}
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, errors.New("tls.cert and tls.key must be set together")
	}
	if k := len(o.SessionKey); k > 0 && k < 32 {
		return nil, fmt.Errorf("server.session_key_file: the key is %d bytes; use at least 32 (openssl rand -hex 32)", k)
	}
	return &HTTPServer{o: o, mcp: s, owners: newOwners(o.SessionKey)}, nil
}

// CheckExposure refuses to serve code execution to a network without
// authentication unless the operator said so in as many words.
func CheckExposure(listen string, tokens *Tokens, allow bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("server.listen %q: %w", listen, err)
	}
	if isLoopback(host) || allow || (tokens != nil && !tokens.Empty()) {
		return nil
	}
	return fmt.Errorf("refusing to serve on %s without authentication: anyone who can reach it could run code. "+
		"Add a token (`airlock token add NAME`, then auth.token_file), listen on 127.0.0.1, or set auth.allow_unauthenticated: true", listen)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// handler is the mux of one listener serving transports.
func (h *HTTPServer) handler(transports []string, authenticate func(http.Handler) http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if h.o.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			if err := h.o.Ready(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(map[string]string{"status": "not ready", "error": err.Error()})
				return
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ready"})
	})
	guard := func(next http.Handler) http.Handler {
		return h.track(h.checkOrigin(authenticate(limitBody(next, h.o.MaxBody))))
	}
	ctxFunc := func(ctx context.Context, r *http.Request) context.Context {
		if p, ok := PrincipalFrom(r.Context()); ok {
			ctx = tools.WithCaller(ctx, tools.Caller{ID: p.ID, Transport: p.Transport})
		}
		return ctx
	}
	if slices.Contains(transports, TransportHTTP) {
		streamable := server.NewStreamableHTTPServer(h.mcp,
			server.WithEndpointPath("/mcp"),
			server.WithHTTPContextFunc(ctxFunc),
			server.WithSessionIdleTTL(sessionIdle),
			server.WithStreamableHTTPLogger(h.o.Log.With("component", "mcp-http")),
		)
		mux.Handle("/mcp", guard(dropStatelessCancel(h.forwardReplies(h.owners.bindStreamable(streamable)))))
	}
	if slices.Contains(transports, TransportSSE) {
		if h.sse == nil {
			h.sse = server.NewSSEServer(h.mcp,
				server.WithSSEEndpoint("/sse"),
				server.WithMessageEndpoint("/message"),
				server.WithSessionIDGenerator(func(_ context.Context, r *http.Request) (string, error) { return h.owners.newSSESession(r) }),
				server.WithSSEContextFunc(func(ctx context.Context, r *http.Request) context.Context {
					ctx = ctxFunc(ctx, r)
					// Calls answer on the stream, not on the POST: tie them to the stream.
					if done := h.owners.sseDone(r.URL.Query().Get("sessionId")); done != nil {
						ctx = tools.WithLifetime(ctx, done)
					}
					return ctx
				}),
				server.WithKeepAlive(true),
				server.WithKeepAliveInterval(15*time.Second),
			)
		}
		mux.Handle("/sse", guard(h.sse.SSEHandler()))
		mux.Handle("/message", guard(h.owners.bindSSEMessages(h.sse.MessageHandler())))
	}
	for path, eh := range h.o.Extra {
		mux.Handle(path, h.checkOrigin(authenticate(eh)))
	}
	return mux
}

// checkOrigin refuses browser requests from other sites (the MCP spec's
// Origin rule): a request with an Origin must come from the server's own
// origin or one the operator allowed.
func (h *HTTPServer) checkOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" && !h.originAllowed(o, r.Host) {
			http.Error(w, "Forbidden: foreign Origin "+o+" (server.allowed_origins)", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *HTTPServer) originAllowed(origin, host string) bool {
	if slices.Contains(h.o.AllowedOrigins, origin) {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

// track counts requests in flight other than the long-lived GET streams.
func (h *HTTPServer) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.active.Add(1)
			defer h.active.Done()
		}
		next.ServeHTTP(w, r)
	})
}

// WaitAnswered waits up to d for requests being answered to finish; then
// answers queued on SSE streams get a moment to be written.
func (h *HTTPServer) WaitAnswered(d time.Duration) {
	done := make(chan struct{})
	go func() { h.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
	if h.sse != nil {
		time.Sleep(250 * time.Millisecond)
	}
}

func limitBody(next http.Handler, max int64) http.Handler {
	if max <= 0 {
		max = defaultMaxBody
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, max)
		next.ServeHTTP(w, r)
	})
}

// dropStatelessCancel drops notifications/cancelled sent without a session
// (protocol 2026-07-28). mcp-go keys requests in flight by session and
// request id, and stateless requests share the empty session, so such a
// notification could cancel another client's call with the same id. A
// stateless client cancels by closing its request, which always works.
func dropStatelessCancel(next http.Handler) http.Handler {
	stateless := func(r *http.Request) bool { return r.Header.Get("Mcp-Session-Id") == "" }
	return inspectBody(next, stateless, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var m struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(body, &m) == nil && m.Method == string(mcp.MethodNotificationCancelled) {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// inspectBody reads the body of each POST that want selects and hands it
// to f, with r's body restored for whatever f passes it on to; other
// requests go straight to next.
func inspectBody(next http.Handler, want func(*http.Request) bool, f func(http.ResponseWriter, *http.Request, []byte)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !want(r) {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		f(w, r, body)
	})
}

// Start listens on the TCP address and the socket, and serves them.
func (h *HTTPServer) Start(ctx context.Context) error {
	errLog := log.New(&slogWriter{h.o.Log}, "", 0)
	if h.o.Listen != "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", h.o.Listen)
		if err != nil {
			h.Close()
			return fmt.Errorf("listen on %s (server.listen): %w", h.o.Listen, err)
		}
		srv := &http.Server{
			Handler: h.handler(h.o.Transports, func(n http.Handler) http.Handler {
				return requireToken(h.o.Tokens, h.anonymousOK(), h.transportName(), n)
			}),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          errLog,
		}
		if h.o.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(h.o.TLSCert, h.o.TLSKey)
			if err != nil {
				ln.Close()
				h.Close()
				return fmt.Errorf("tls.cert/tls.key: %w", err)
			}
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
			ln = tls.NewListener(ln, srv.TLSConfig)
		}
		h.serve(srv, ln)
	}
	if h.o.Socket != "" {
		ln, err := listenUnix(h.o.Socket, h.o.SocketGroup, h.o.Log)
		if err != nil {
			h.Close()
			return fmt.Errorf("server.socket %s: %w", h.o.Socket, err)
		}
		srv := &http.Server{
			// `airlock connect` speaks streamable HTTP, whatever the TCP side serves.
			Handler:           h.handler([]string{TransportHTTP}, func(n http.Handler) http.Handler { return requirePeer(h.o.SocketGroup, n) }),
			ReadHeaderTimeout: 10 * time.Second,
			ConnContext:       peerContext,
			ErrorLog:          errLog,
		}
		h.serve(srv, ln)
	}
	return nil
}

// anonymousOK reports whether clients may go without a token while none is
// configured: on loopback, or where the operator said so.
func (h *HTTPServer) anonymousOK() bool {
	host, _, _ := net.SplitHostPort(h.o.Listen)
	return isLoopback(host) || h.o.AllowUnauthenticated
}

func (h *HTTPServer) transportName() string {
	return strings.Join(h.o.Transports, "+")
}

func (h *HTTPServer) serve(srv *http.Server, ln net.Listener) {
	h.servers = append(h.servers, srv)
	h.addrs = append(h.addrs, ln.Addr())
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.o.Log.Error("http listener stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	h.o.Log.Info("serving MCP over HTTP", "addr", ln.Addr().String(), "transports", h.o.Transports)
}

// Addrs are the addresses listened on, TCP first.
func (h *HTTPServer) Addrs() []net.Addr { return h.addrs }

// StopAccepting closes the listeners; connections already open stay until
// Close, so calls in flight can still answer.
func (h *HTTPServer) StopAccepting() {
	for _, srv := range h.servers {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			_ = srv.Shutdown(ctx)
		}()
	}
}

// Close drops every connection, SSE streams included.
func (h *HTTPServer) Close() {
	if h.sse != nil {
		h.sse.CloseSessions()
	}
	for _, srv := range h.servers {
		_ = srv.Close()
	}
	h.wg.Wait()
}
