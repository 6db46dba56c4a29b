package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestIsReply(t *testing.T) {
	for body, want := range map[string]bool{
		`{"jsonrpc":"2.0","id":3,"result":{"action":"accept"}}`:         true,
		`{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"no"}}`: true,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{}}`:    false,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`:        false,
		`{"jsonrpc":"2.0","result":{}}`:                                 false,
		`[{"jsonrpc":"2.0","id":3,"result":{}}]`:                        false,
		`not json`:                                                      false,
	} {
		if got := isReply([]byte(body)); got != want {
			t.Errorf("isReply(%s) = %v, want %v", body, got, want)
		}
	}
}

// A reply this replica cannot place goes to the peer that takes it, as the
// client sent it; anything else, and a reply already handed on, stays.
func TestForwardReplies(t *testing.T) {
	var got atomic.Value
	var hits atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Header.Get("Authorization") + "|" + r.Header.Get("Mcp-Session-Id") + "|" + r.Header.Get(headerForwarded) + "|" + string(b))
		w.WriteHeader(http.StatusAccepted)
	}))
	defer peer.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		http.Error(w, "no", http.StatusNotFound)
	}))
	defer refusing.Close()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	h := &HTTPServer{o: HTTPOptions{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Peers: func(context.Context) ([]string, error) { return []string{addr(refusing), addr(peer)}, nil }}}
	local := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "No active session found for the given session ID", http.StatusNotFound)
	})
	handler := h.forwardReplies(local)
	reply := `{"jsonrpc":"2.0","id":7,"result":{"action":"accept","content":{"approve":true}}}`
	cases := []struct {
		name, body, forwarded string
		session               bool
		wantStatus            int
		wantHits              int32
	}{
		{name: "a reply", body: reply, session: true, wantStatus: http.StatusAccepted, wantHits: 2},
		{name: "a request", body: `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`, session: true, wantStatus: http.StatusNotFound},
		{name: "no session", body: reply, wantStatus: http.StatusNotFound},
		{name: "already handed on", body: reply, session: true, forwarded: "1", wantStatus: http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hits.Store(0)
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(tc.body))
			r.Header.Set("Authorization", "Bearer tok")
			if tc.session {
				r.Header.Set("Mcp-Session-Id", "sid")
			}
			if tc.forwarded != "" {
				r.Header.Set(headerForwarded, tc.forwarded)
			}
			w := httptest.NewRecorder()
			handler.ServeHTTP(w, r)
			if w.Code != tc.wantStatus || hits.Load() != tc.wantHits {
				t.Fatalf("status %d, peers asked %d; want %d, %d", w.Code, hits.Load(), tc.wantStatus, tc.wantHits)
			}
			if tc.wantHits > 0 {
				if g := got.Load(); g != "Bearer tok|sid|1|"+reply {
					t.Errorf("the peer got %q", g)
				}
			}
		})
	}
}
