//go:build !linux

package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
)

func listenUnix(string, string, *slog.Logger) (net.Listener, error) {
	return nil, errors.New("the local socket needs Linux (SO_PEERCRED)")
}

func peerContext(ctx context.Context, _ net.Conn) context.Context { return ctx }

func requirePeer(_ string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "Forbidden", http.StatusForbidden)
	})
}
