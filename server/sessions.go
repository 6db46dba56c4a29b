package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
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
//
// A streamable HTTP session id handed to a client carries an HMAC of the
// principal and mcp-go's id. With a key shared by several airlock replicas
// (server.session_key_file), any replica accepts a session another opened,
// from that session's owner only: the binding travels in the id, no store
// is shared. Without one the key is random per process and a session is
// known only where it began.
type owners struct {
	mu     sync.Mutex
	m      map[string]*owner
	key    []byte
	shared bool
}

type owner struct {
	principal string
	seen      time.Time
	done      chan struct{}
}

// newOwners returns an empty table; key is the replicas' shared session
// key, or nil for one of this process's own.
func newOwners(key []byte) *owners {
	o := &owners{m: map[string]*owner{}, key: key, shared: len(key) > 0}
	if !o.shared {
		o.key = make([]byte, 32)
		_, _ = rand.Read(o.key)
	}
	return o
}

// sign returns the id a client is given for mcp-go's session id.
func (o *owners) sign(principal, id string) string {
	return id + "." + o.mac(principal, id)
}

func (o *owners) mac(principal, id string) string {
	h := hmac.New(sha256.New, o.key)
	h.Write([]byte(principal))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// verify returns mcp-go's session id inside a signed one, if principal
// owns it.
func (o *owners) verify(principal, signed string) (string, bool) {
	i := strings.LastIndexByte(signed, '.')
	if i < 0 {
		return "", false
	}
	id, mac := signed[:i], signed[i+1:]
	return id, hmac.Equal([]byte(mac), []byte(o.mac(principal, id)))
}

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
// session hands out its signed id and records its owner.
func (o *owners) bindStreamable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		me := principalID(r)
		if signed := r.Header.Get("Mcp-Session-Id"); signed != "" {
			id, ok := o.verify(me, signed)
			if ok {
				if _, known := o.check(signed, me); !known {
					// Another replica's session (shared key), or one this
					// process forgot (idle, or ended by DELETE).
					ok = o.shared
					if ok {
						o.add(signed, me, nil)
					}
				}
			}
			if !ok {
				// The same answer as for a session that never existed.
				http.Error(w, "Invalid session ID", http.StatusNotFound)
				return
			}
			if r.Method == http.MethodDelete {
				defer o.remove(signed)
			}
			r = r.Clone(r.Context())
			r.Header.Set("Mcp-Session-Id", id)
		}
		next.ServeHTTP(&sessionRecorder{ResponseWriter: w, owners: o, principal: me}, r)
	})
}

// sessionRecorder signs the session id a response hands out.
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
		signed := s.owners.sign(s.principal, id)
		s.Header().Set("Mcp-Session-Id", signed)
		if _, ok := s.owners.check(signed, s.principal); !ok {
			s.owners.add(signed, s.principal, nil)
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
