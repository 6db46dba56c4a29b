package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/local/guardian"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/server"
)

func (a *app) serveCmd() *cobra.Command {
	var transport, connect string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the MCP tools: stdio (Claude Desktop, IDEs), http (streamable HTTP at /mcp), sse (/sse), or http,sse",
		RunE: func(cmd *cobra.Command, _ []string) error {
			transports := strings.Split(transport, ",")
			if transport == "stdio" {
				if a.cfg.Audit.Stdout && connect == "" {
					return fmt.Errorf("audit.stdout: with --transport stdio, stdout carries the MCP messages; set audit.path instead, or serve http")
				}
				if connect != "" {
					return a.relay(cmd.Context(), connect)
				}
				return a.serveStdio(cmd)
			}
			if connect != "" {
				return fmt.Errorf("--connect relays stdio: use it with --transport stdio")
			}
			for _, t := range transports {
				if t != server.TransportHTTP && t != server.TransportSSE {
					return fmt.Errorf("transport %q: use stdio, http, sse, or http,sse", t)
				}
			}
			return a.serveHTTP(cmd, transports)
		},
	}
	cmd.Flags().StringVar(&transport, "transport", "stdio", "MCP transport: stdio, http, sse, or http,sse")
	cmd.Flags().String("listen", "", "address of the HTTP transports (server.listen, default 127.0.0.1:8765)")
	_ = a.v.BindPFlag("server.listen", cmd.Flags().Lookup("listen"))
	cmd.Flags().StringVar(&connect, "connect", "", "with --transport stdio: relay to a running daemon instead, e.g. unix:///run/airlock/airlock.sock (what `airlock connect` does)")
	return cmd
}

// serveStdio serves one client on stdin and stdout until stdin ends (the
// client went away) or a signal comes. Then it leaves at once: runs in
// flight are cancelled, their records written, and the teardown of its
// sandboxes is handed to its guardian, which the kernel tells the moment
// this process exits. A desktop client gives a server two seconds before
// SIGTERM, and SIGKILL two after.
func (a *app) serveStdio(cmd *cobra.Command) error {
	return a.withBackend(cmd, func(ctx context.Context, b *backend) error {
		var g *guardian.Guardian
		if b.local != nil {
			g = a.startGuardian(cmd, b.local)
		}
		h, closeHandlers, err := a.handlers(ctx, b)
		if err != nil {
			return err
		}
		defer closeHandlers()
		stopMetrics, err := a.startMetrics(ctx)
		if err != nil {
			return err
		}
		defer stopMetrics()
		a.log.Info("serving", append([]any{"transport", "stdio", "instance", b.Instance, "guardian", g.PID(), "approval", a.cfg.Approval.Mode}, b.Attrs...)...)
		s := server.New(a.version, h)
		workers := a.cfg.Limits.Concurrency + a.cfg.Limits.Queue + 8
		err = server.ServeStdio(ctx, s, os.Stdin, os.Stdout, server.StdioCaller(), workers, int(maxMessageBytes(a.cfg)), a.log)
		if g != nil {
			// Runs in flight were cancelled as input ended; what is left
			// is the guardian's to remove once this process is gone.
			h.Detach()
			b.handOff()
			_ = g.HandOff()
			a.log.Info("leaving; the guardian removes this instance's sandboxes", "guardian", g.PID())
		}
		return err
	})
}

// serveHTTP serves the network transports and the local socket until
// SIGTERM or SIGINT, then shuts down gracefully: it stops accepting, lets
// runs in flight finish for server.shutdown_grace, cancels the rest, and
// exits 0 with nothing left behind.
func (a *app) serveHTTP(cmd *cobra.Command, transports []string) error {
	cfg := a.cfg
	tokens, err := a.clientTokens()
	if err != nil {
		return err
	}
	// Before the runtime comes up: a refusal should be quick and plain.
	if cfg.Server.Listen != "" {
		if err := server.CheckExposure(cfg.Server.Listen, tokens, cfg.Auth.AllowUnauthenticated); err != nil {
			return err
		}
	}
	// The guardian removes this daemon's sandboxes should it be killed;
	// told "done", after the teardown below, it leaves without a sweep.
	var g *guardian.Guardian
	defer func() { _ = g.Done() }()
	return a.withBackend(cmd, func(ctx context.Context, b *backend) error {
		if b.local != nil {
			g = a.startGuardian(cmd, b.local)
		}
		h, closeHandlers, err := a.handlers(ctx, b)
		if err != nil {
			return err
		}
		defer closeHandlers()
		stopMetrics, err := a.startMetrics(ctx)
		if err != nil {
			return err
		}
		defer stopMetrics()
		s := server.New(a.version, h)
		var sessionKey []byte
		if f := cfg.Server.SessionKeyFile; f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("server.session_key_file: %w", err)
			}
			sessionKey = bytes.TrimSpace(b)
		}
		srv, err := server.NewHTTP(s, server.HTTPOptions{
			Listen: cfg.Server.Listen, Transports: transports,
			Socket: cfg.Server.Socket, SocketGroup: cfg.Server.SocketGroup,
			TLSCert: cfg.TLS.Cert, TLSKey: cfg.TLS.Key,
			Tokens: tokens, AllowUnauthenticated: cfg.Auth.AllowUnauthenticated,
			AllowedOrigins: cfg.Server.AllowedOrigins,
			Ready:          b.Ready,
			Extra:          map[string]http.Handler{"/metrics": metrics.Handler()},
			// A write_file of the largest file, base64-encoded, must fit.
			MaxBody:    maxMessageBytes(cfg),
			SessionKey: sessionKey,
			Peers:      peersOf(cfg, b),
			Log:        a.log,
		})
		if err != nil {
			return err
		}
		if err := srv.Start(ctx); err != nil {
			return err
		}
		a.log.Info("serving", append([]any{"transports", transports, "listen", cfg.Server.Listen, "socket", cfg.Server.Socket, "auth", tokens != nil,
			"instance", b.Instance, "approval", cfg.Approval.Mode}, b.Attrs...)...)
		<-ctx.Done()
		start := time.Now()
		a.log.Info("shutting down: no new connections; runs in flight may finish", "in_flight", h.InFlight(), "grace", cfg.Server.ShutdownGrace)
		srv.StopAccepting()
		h.Drain(cfg.Server.ShutdownGrace)
		srv.WaitAnswered(5 * time.Second)
		srv.Close()
		a.log.Info("shut down", "took", time.Since(start).Round(time.Millisecond))
		return nil
	})
}

// clientTokens is the bearer-token store of the HTTP transports. While it
// holds no token, only loopback is served without one, unless the operator
// allows otherwise; the first token added turns authentication on.
func (a *app) clientTokens() (*server.Tokens, error) {
	var static []server.Token
	for _, t := range a.cfg.Auth.Tokens {
		tok, err := server.ParseTokenHash(t.Name, t.SHA256)
		if err != nil {
			return nil, fmt.Errorf("auth.tokens: %w", err)
		}
		static = append(static, tok)
	}
	return server.NewTokens(static, a.cfg.ClientTokenFile())
}

// maxMessageBytes bounds one JSON-RPC message on every transport: room for
// the largest file write_file takes, base64-encoded, plus headroom, and
// never less than 8 MiB (code is capped far below that by limits.code_bytes).
func maxMessageBytes(cfg config.Config) int64 {
	return max(8<<20, int64(cfg.Files.MaxFileMB)<<20*4/3+1<<20, int64(cfg.Limits.CodeBytes)*6+1<<20)
}

// peersOf is where a client's reply this replica cannot place is handed
// on: the other replicas, when this one advertises an address they reach
// it at over plain HTTP (with tls set, replicas are not handed replies).
func peersOf(cfg config.Config, b *backend) func(context.Context) ([]string, error) {
	if b.Peers == nil || cfg.Server.Advertise == "" || cfg.TLS.Cert != "" {
		return nil
	}
	return b.Peers
}
