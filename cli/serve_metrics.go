package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/airlock-mcp/airlock/metrics"
)

// startMetrics serves /metrics on metrics.listen (loopback only, checked by
// the config), for deployments without the HTTP transports. The returned
// function stops it.
func (a *app) startMetrics(ctx context.Context) (func(), error) {
	addr := a.cfg.Metrics.Listen
	if addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler())
	bound, stop, err := a.serveSide(ctx, addr, mux, "metrics endpoint")
	if err != nil {
		return nil, fmt.Errorf("metrics.listen %s: %w", addr, err)
	}
	a.log.Info("metrics listening", "url", "http://"+bound.String()+"/metrics")
	return stop, nil
}

// serveSide serves h on addr beside the MCP transports (the approval
// console, the metrics endpoint) until the returned stop is called. what
// names it in the log if it stops on its own.
func (a *app) serveSide(ctx context.Context, addr string, h http.Handler, what string) (net.Addr, func(), error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error(what+" stopped", "err", err)
		}
	}()
	return ln.Addr(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
