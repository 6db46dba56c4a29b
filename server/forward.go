package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// headerForwarded marks a client's reply that one replica passed to
// another, which must not pass it on again.
const headerForwarded = "Airlock-Forwarded"

// forwardTimeout bounds the handing of one reply to the other replicas.
const forwardTimeout = 10 * time.Second

// A 2025-11-25 client answers a request airlock sent it (elicitation/create,
// the approval question) by POSTing a JSON-RPC response with its session
// id. mcp-go holds the request waiting for it in the memory of the replica
// that sent it, and behind a Service the answer may reach another one,
// which knows nothing of it. forwardReplies hands such an answer, when
// this replica cannot place it, to the other replicas (Peers) as the
// client sent it, bearer token and session id included: the one that
// asked takes it, after checking both again; the others refuse it as this
// one did.
func (h *HTTPServer) forwardReplies(next http.Handler) http.Handler {
	if h.o.Peers == nil {
		return next
	}
	// A session's POST, not handed on already.
	want := func(r *http.Request) bool {
		return r.Header.Get("Mcp-Session-Id") != "" && r.Header.Get(headerForwarded) == ""
	}
	return inspectBody(next, want, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !isReply(body) {
			next.ServeHTTP(w, r)
			return
		}
		rec := &replyRecorder{header: http.Header{}}
		next.ServeHTTP(rec, r)
		if rec.status != http.StatusNotFound && rec.status != http.StatusBadRequest {
			rec.copyTo(w)
			return
		}
		if h.forward(r, body) {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		rec.copyTo(w)
	})
}

// isReply reports whether body is one JSON-RPC response (an id, a result
// or an error, no method).
func isReply(body []byte) bool {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == "" && len(m.ID) > 0 && (m.Result != nil || m.Error != nil)
}

// forward offers the reply to each other replica until one takes it.
func (h *HTTPServer) forward(r *http.Request, body []byte) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), forwardTimeout)
	defer cancel()
	peers, err := h.o.Peers(ctx)
	if err != nil {
		h.o.Log.Warn("a client's reply this replica cannot place: the other replicas are unknown", "err", err)
		return false
	}
	for _, addr := range peers {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/mcp", bytes.NewReader(body))
		if err != nil {
			continue
		}
		for _, k := range []string{"Authorization", "Mcp-Session-Id", "Mcp-Protocol-Version", "Content-Type", "Accept"} {
			if v := r.Header.Get(k); v != "" {
				req.Header.Set(k, v)
			}
		}
		req.Header.Set(headerForwarded, "1")
		resp, err := peerClient.Do(req)
		if err != nil {
			h.o.Log.Warn("forward a client's reply", "peer", addr, "err", err)
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			return true
		}
	}
	return false
}

// peerClient talks to the other replicas: never through a proxy, never
// redirected.
var peerClient = &http.Client{
	Timeout:       forwardTimeout,
	Transport:     &http.Transport{Proxy: nil},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// replyRecorder keeps the local answer to a reply until it is known
// whether another replica takes it instead.
type replyRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *replyRecorder) Header() http.Header { return r.header }
func (r *replyRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *replyRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

func (r *replyRecorder) copyTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
