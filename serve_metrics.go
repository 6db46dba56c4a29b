package main

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
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics.listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics endpoint stopped", "err", err)
		}
	}()
	a.log.Info("metrics listening", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
