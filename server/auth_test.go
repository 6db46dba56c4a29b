package server

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTokensFromFileAndReload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "client.tokens")
	secretA, lineA, err := NewSecret("alice")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := NewTokens(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	if !tokens.Empty() {
		t.Fatal("a missing token file holds tokens")
	}
	if err := os.WriteFile(file, []byte("# clients\n"+lineA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens.checked = time.Time{} // skip the once-a-second wait
	if name, ok := tokens.Lookup(secretA); !ok || name != "alice" {
		t.Fatalf("Lookup after adding = %q, %v", name, ok)
	}
	if _, ok := tokens.Lookup(secretA + "x"); ok {
		t.Error("a different secret matched")
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens.checked = time.Time{}
	if _, ok := tokens.Lookup(secretA); ok {
		t.Error("a revoked token still works")
	}
}

func TestTokenFileErrors(t *testing.T) {
	for _, bad := range []string{"alice:plain-secret\n", "alice:sha256:abcd\n", ":sha256:" + strings.Repeat("a", 64) + "\n"} {
		file := filepath.Join(t.TempDir(), "t")
		_ = os.WriteFile(file, []byte(bad), 0o600)
		if _, err := NewTokens(nil, file); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("token file %q: err = %v, want it to name line 1", bad, err)
		}
	}
}

func TestRequireToken(t *testing.T) {
	secret, line, _ := NewSecret("ci")
	tok, _ := ParseTokenHash("ci", strings.Split(line, ":")[2])
	store, _ := NewTokens([]Token{tok}, "")
	var got Principal
	h := requireToken(store, true, "http", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got, _ = PrincipalFrom(r.Context()) }))
	cases := []struct {
		name, auth string
		status     int
	}{
		{"none", "", 401},
		{"wrong", "Bearer nope", 401},
		{"not bearer", "Basic " + secret, 401},
		{"right", "Bearer " + secret, 200},
	}
	for _, c := range cases {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.status {
			t.Errorf("%s: status %d, want %d", c.name, w.Code, c.status)
		}
		if c.status == 401 && !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), `Bearer realm="airlock"`) {
			t.Errorf("%s: WWW-Authenticate = %q", c.name, w.Header().Get("WWW-Authenticate"))
		}
	}
	if got.ID != "token:ci" || got.Transport != "http" {
		t.Errorf("principal = %+v", got)
	}
	// No tokens at all: anonymous only where allowed.
	empty, _ := NewTokens(nil, "")
	for _, anon := range []bool{true, false} {
		w := httptest.NewRecorder()
		requireToken(empty, anon, "http", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest("GET", "/mcp", nil))
		if (w.Code == 200) != anon {
			t.Errorf("no tokens, anonymousOK=%v: status %d", anon, w.Code)
		}
	}
}

func TestCheckExposure(t *testing.T) {
	secretLess, _ := NewTokens(nil, "")
	_, line, _ := NewSecret("x")
	tok, _ := ParseTokenHash("x", strings.Split(line, ":")[2])
	withToken, _ := NewTokens([]Token{tok}, "")
	cases := []struct {
		listen string
		tokens *Tokens
		allow  bool
		ok     bool
	}{
		{"127.0.0.1:8765", nil, false, true},
		{"[::1]:8765", secretLess, false, true},
		{"localhost:8765", nil, false, true},
		{"0.0.0.0:8765", nil, false, false},
		{"0.0.0.0:8765", secretLess, false, false},
		{"10.1.2.3:8765", withToken, false, true},
		{"0.0.0.0:8765", nil, true, true},
	}
	for _, c := range cases {
		err := CheckExposure(c.listen, c.tokens, c.allow)
		if (err == nil) != c.ok {
			t.Errorf("CheckExposure(%s, tokens=%v, allow=%v) = %v", c.listen, c.tokens != nil && !c.tokens.Empty(), c.allow, err)
		}
		if err != nil && !strings.Contains(err.Error(), "auth.allow_unauthenticated") {
			t.Errorf("refusal does not say how to proceed: %v", err)
		}
	}
}

func TestOriginCheck(t *testing.T) {
	h := &HTTPServer{o: HTTPOptions{AllowedOrigins: []string{"https://agents.example"}}}
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, c := range []struct {
		origin string
		status int
	}{{"", 200}, {"http://airlock.internal:8765", 200}, {"https://agents.example", 200}, {"http://evil.example", 403}, {"null", 403}} {
		r := httptest.NewRequest("POST", "http://airlock.internal:8765/mcp", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		w := httptest.NewRecorder()
		h.checkOrigin(next).ServeHTTP(w, r)
		if w.Code != c.status {
			t.Errorf("Origin %q: status %d, want %d", c.origin, w.Code, c.status)
		}
	}
}

// fakeMCP plays mcp-go behind bindStreamable: initialize hands out
// session id "s-1"; a later request reaches it with the id mcp-go gave.
func fakeMCP(seen *string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*seen = r.Header.Get("Mcp-Session-Id")
		if *seen == "" {
			w.Header().Set("Mcp-Session-Id", "s-1")
		}
		w.WriteHeader(200)
	})
}

// post sends a request as who, naming session when not empty; it returns
// the status and the session id the response handed out.
func post(h http.Handler, who, session string) (int, string) {
	r := httptest.NewRequest("POST", "/mcp", nil)
	r = r.WithContext(withPrincipal(r.Context(), Principal{ID: who}))
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Header().Get("Mcp-Session-Id")
}

func TestSessionOwnership(t *testing.T) {
	o := newOwners(nil)
	var seen string
	h := o.bindStreamable(fakeMCP(&seen))
	code, id := post(h, "alice", "")
	if code != 200 || id == "" || id == "s-1" {
		t.Fatalf("initialize: %d, session id %q; want a signed id", code, id)
	}
	if code, _ := post(h, "alice", id); code != 200 || seen != "s-1" {
		t.Errorf("the owner's own session: %d, mcp-go saw %q; want 200 and s-1", code, seen)
	}
	for _, c := range []struct{ who, id, why string }{
		{"bob", id, "another client used alice's session"},
		{"alice", "s-1", "the unsigned id was accepted"},
		{"alice", "s-unknown.0123", "an unknown session was accepted"},
		{"alice", id + "0", "a changed signature was accepted"},
	} {
		if code, _ := post(h, c.who, c.id); code != 404 {
			t.Errorf("%s: status %d", c.why, code)
		}
	}
	// Another process without the shared key knows nothing of the session.
	if code, _ := post(newOwners(nil).bindStreamable(fakeMCP(&seen)), "alice", id); code != 404 {
		t.Errorf("a session of another process without a shared key: status %d, want 404", code)
	}
}

// With one key shared by replicas, a session opened on one is served by
// another, for its owner and no one else; a replica with another key
// refuses it.
func TestSessionSharedAcrossReplicas(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	var seenA, seenB string
	a := newOwners(key).bindStreamable(fakeMCP(&seenA))
	b := newOwners(key).bindStreamable(fakeMCP(&seenB))
	_, id := post(a, "alice", "")
	if code, _ := post(b, "alice", id); code != 200 || seenB != "s-1" {
		t.Errorf("alice's session on the other replica: %d, mcp-go saw %q; want 200 and s-1", code, seenB)
	}
	if code, _ := post(b, "bob", id); code != 404 {
		t.Errorf("bob with alice's session on the other replica: %d, want 404", code)
	}
	other := newOwners([]byte("fedcba9876543210fedcba9876543210")).bindStreamable(fakeMCP(&seenB))
	if code, _ := post(other, "alice", id); code != 404 {
		t.Errorf("a replica with another key: %d, want 404", code)
	}
}

func TestDropStatelessCancel(t *testing.T) {
	reached := 0
	h := dropStatelessCancel(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	post := func(body, session string) int {
		r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
		if session != "" {
			r.Header.Set("Mcp-Session-Id", session)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	cancel := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`
	if post(cancel, "") != 202 || reached != 0 {
		t.Error("a sessionless cancellation reached the server")
	}
	post(cancel, "s-1")
	post(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "")
	if reached != 2 {
		t.Errorf("reached = %d, want the session cancel and the request through", reached)
	}
}

// A token added to the file is honoured by the next request, not a second
// later: until then the server would still take callers as anonymous, and
// the caller would lose its name (and its sessions) to a per-connection one.
func TestTokenAddedJustNowIsHonoured(t *testing.T) {
	file := filepath.Join(t.TempDir(), "client.tokens")
	tokens, err := NewTokens(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	var got Principal
	h := requireToken(tokens, true, "http", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got, _ = PrincipalFrom(r.Context()) }))
	serve := func(auth string) int {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		got = Principal{}
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := serve(""); code != 200 || got.ID != "" {
		t.Fatalf("no tokens yet, loopback: %d %+v; want anonymous", code, got)
	}
	secret, line, _ := NewSecret("alice")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := serve("Bearer " + secret); code != 200 || got.ID != "token:alice" {
		t.Fatalf("token added a moment ago: %d %+v; want token:alice", code, got)
	}
	if code := serve(""); code != 401 {
		t.Fatalf("anonymous once a token exists: %d", code)
	}
	secret2, line2, _ := NewSecret("bob")
	if err := os.WriteFile(file, []byte(line+"\n"+line2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := serve("Bearer " + secret2); code != 200 || got.ID != "token:bob" {
		t.Fatalf("second token added a moment ago: %d %+v", code, got)
	}
}
