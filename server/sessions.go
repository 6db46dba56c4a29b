package server

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// sessionIdle is how long a streamable HTTP session may go unused before
// both mcp-go and airlock forget it.
const sessionIdle = 30 * time.Minute

// owners binds MCP session ids to the principal that opened them, so one
// client can never post into, read from, or cancel inside another's session,
// even knowing its id. An SSE session also gets a done channel, closed when
// its stream ends, which cancels the session's calls still running.
type owners struct {
	mu sync.Mutex
	m  map[string]*owner
}

type owner struct {
	principal string
	seen      time.Time
	done      chan struct{}
}

func newOwners() *owners { return &owners{m: map[string]*owner{}} }

func (o *owners) add(id, principal string, done chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	for k, v := range o.m {
		if v.done == nil && now.Sub(v.seen) > sessionIdle {
			delete(o.m, k)
		}
	}
	o.m[id] = &owner{principal: principal, seen: now, done: done}
}

// check reports whether session id exists and belongs to principal.
func (o *owners) check(id, principal string) (*owner, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ow := o.m[id]
	if ow == nil || ow.principal != principal {
		return nil, false
	}
	ow.seen = time.Now()
	return ow, true
}

func (o *owners) remove(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, id)
}

func principalID(r *http.Request) string {
	if p, ok := PrincipalFrom(r.Context()); ok {
		return p.ID
	}
	return "anonymous"
}

// bindStreamable guards the streamable HTTP endpoint: a request naming a
// session must come from the session's owner, and a response that starts a
// session records its owner.
func (o *owners) bindStreamable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		me := principalID(r)
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			if _, ok := o.check(id, me); !ok {
				// The same answer as for a session that never existed.
				http.Error(w, "Invalid session ID", http.StatusNotFound)
				return
			}
			if r.Method == http.MethodDelete {
				defer o.remove(id)
			}
		}
		next.ServeHTTP(&sessionRecorder{ResponseWriter: w, owners: o, principal: me}, r)
	})
}

// sessionRecorder notes the session id a response hands out.
type sessionRecorder struct {
	http.ResponseWriter
	owners    *owners
	principal string
	wrote     bool
}

func (s *sessionRecorder) note() {
	if s.wrote {
		return
	}
	s.wrote = true
	if id := s.Header().Get("Mcp-Session-Id"); id != "" {
		if _, ok := s.owners.check(id, s.principal); !ok {
			s.owners.add(id, s.principal, nil)
		}
	}
}

func (s *sessionRecorder) WriteHeader(code int) { s.note(); s.ResponseWriter.WriteHeader(code) }
func (s *sessionRecorder) Write(b []byte) (int, error) {
	s.note()
	return s.ResponseWriter.Write(b)
}

// Flush keeps streaming (SSE upgrades of POST responses) working.
func (s *sessionRecorder) Flush() {
	s.note()
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (s *sessionRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// newSSESession makes the id of a new legacy SSE session, records its
// owner, and closes its done channel when the stream's request ends.
func (o *owners) newSSESession(r *http.Request) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	done := make(chan struct{})
	o.add(id, principalID(r), done)
	go func() {
		<-r.Context().Done()
		close(done)
		o.remove(id)
	}()
	return id, nil
}

// bindSSEMessages guards the SSE message endpoint like bindStreamable.
func (o *owners) bindSSEMessages(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := o.check(r.URL.Query().Get("sessionId"), principalID(r)); !ok {
			http.Error(w, "Invalid session ID", http.StatusNotFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sseDone returns the done channel of SSE session id.
func (o *owners) sseDone(id string) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ow := o.m[id]; ow != nil && ow.done != nil {
		return ow.done
	}
	return nil
}
