package kube

import (
	"context"
	"log/slog"

	"k8s.io/klog/v2"
)

// quietClientGo sends client-go's own log lines to log at debug level.
// It reports, as errors, the closing of every attach stream airlock ends
// on purpose; on the stdio transport that would be noise on the client's
// stderr for every call.
func quietClientGo(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(debugOnly{log.With("component", "client-go").Handler()}))
}

// debugOnly is a slog handler that writes every record at debug level.
type debugOnly struct{ h slog.Handler }

func (d debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugOnly) Handle(ctx context.Context, r slog.Record) error {
	// Not every caller asks Enabled first.
	if !d.h.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugOnly) WithAttrs(as []slog.Attr) slog.Handler { return debugOnly{d.h.WithAttrs(as)} }
func (d debugOnly) WithGroup(name string) slog.Handler    { return debugOnly{d.h.WithGroup(name)} }
