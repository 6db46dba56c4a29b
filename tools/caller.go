package tools

import (
	"context"

	"github.com/mark3labs/mcp-go/server"
)

// Caller is who made a call: the identity approvals are bound to and the
// audit log records, and the transport it came over.
type Caller struct {
	// ID names the client: a token's name, a peer's uid, "stdio:alice".
	ID        string
	Transport string
}

type callerKey struct{}

// WithCaller returns ctx carrying c. Transports set it from what they know
// of the peer; a handler never takes an identity from the call's arguments.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller the transport recorded in ctx. Without one,
// the MCP session names the caller, so two sessions are never one client.
func CallerFrom(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok && c.ID != "" {
		return c
	}
	if s := server.ClientSessionFromContext(ctx); s != nil {
		return Caller{ID: "session:" + s.SessionID(), Transport: "unknown"}
	}
	return Caller{ID: "unknown", Transport: "unknown"}
}
