// Package server builds airlock's MCP server and serves it over its
// transports. This transport is stdio; its stdout carries only
// JSON-RPC, so everything else logs to stderr.
package server

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/user"

	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/tools"
)

// Instructions tell the model what this server is for.
const Instructions = "airlock runs Python and shell code in isolated, single-use gVisor sandboxes with no network access. " +
	"Use run_python for computation and data work (numpy, pandas, matplotlib are installed) and run_shell for command-line tools. " +
	"Each call starts from a clean sandbox; print the results you need."

// New returns an MCP server with airlock's tools registered.
func New(version string, h *tools.Handlers) *server.MCPServer {
	s := server.NewMCPServer("airlock", version, append([]server.ServerOption{
		server.WithToolCapabilities(false),
		server.WithInstructions(Instructions),
		server.WithRecovery(),
		server.WithLogging(),
		tools.AppsExtension(),
	}, h.ServerOptions()...)...)
	h.Register(s)
	return s
}

// ServeStdio serves s on in/out until in closes or ctx ends. Every call is
// attributed to caller: a stdio server has exactly one client, the process
// that started it. A message longer than maxMessage bytes is refused with a
// JSON-RPC error without being held in memory, and the next one is read.
func ServeStdio(ctx context.Context, s *server.MCPServer, in io.Reader, out io.Writer, caller tools.Caller, workers, maxMessage int, logger *slog.Logger) error {
	stdio := server.NewStdioServer(s)
	// One lock for every write to out: responses, requests to the client
	// (mcp-go writes those without its own lock) and the limiter's refusals.
	out = &lockedWriter{w: out}
	in = newLineLimiter(in, maxMessage, out)
	// Calls are served by a fixed set of workers: enough for every sandbox
	// and queued call, with room for list_runs and cancel_run besides.
	server.WithWorkerPoolSize(workers)(stdio)
	stdio.SetErrorLogger(log.New(&slogWriter{logger}, "", 0))
	stdio.SetContextFunc(func(ctx context.Context) context.Context { return tools.WithCaller(ctx, caller) })
	err := stdio.Listen(ctx, in, out)
	if err == context.Canceled || err == io.EOF {
		return nil
	}
	return err
}

// StdioCaller names the client of a stdio server: the user who started
// it, as sudo reports them when it was started through sudo.
func StdioCaller() tools.Caller {
	name := os.Getenv("SUDO_USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		} else {
			name = fmt.Sprintf("uid%d", os.Getuid())
		}
	}
	return tools.Caller{ID: "stdio:" + name, Transport: "stdio"}
}

// slogWriter sends mcp-go's log.Logger lines to slog (on stderr).
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	w.l.Warn("mcp", "msg", string(p))
	return len(p), nil
}
