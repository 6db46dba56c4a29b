package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Token is a client credential as airlock stores it: a name (the client's
// identity in audit records and quotas) and the SHA-256 of the secret.
// Secrets themselves are never stored.
type Token struct {
	Name string
	Hash [sha256.Size]byte
}

// ParseTokenHash builds a Token from a name and a hex SHA-256.
func ParseTokenHash(name, hexHash string) (Token, error) {
	var t Token
	b, err := hex.DecodeString(hexHash)
	if err != nil || len(b) != sha256.Size {
		return t, fmt.Errorf("token %q: sha256 must be 64 hex digits", name)
	}
	if name == "" || strings.ContainsAny(name, ": \t") {
		return t, fmt.Errorf("token name %q must be non-empty, without ':' or spaces", name)
	}
	t.Name = name
	copy(t.Hash[:], b)
	return t, nil
}

// Tokens authenticates bearer tokens against a fixed list and a token
// file that is read again when it changes, so tokens can be added or
// revoked without a restart.
type Tokens struct {
	static []Token
	file   string

	mu        sync.Mutex
	fromFile  []Token
	fileStamp string
	checked   time.Time
	fileErr   error
}

// NewTokens returns a store of static tokens plus those in file (may be "").
// A file that does not exist yet holds no tokens; one that cannot be parsed
// is an error here, and after a later change keeps the last good list.
func NewTokens(static []Token, file string) (*Tokens, error) {
	t := &Tokens{static: static, file: file}
	if err := t.reload(true); err != nil {
		return nil, err
	}
	return t, nil
}

// reload re-reads the file when its size or time changed; at most once a
// second unless forced.
func (t *Tokens) reload(force bool) error {
	if t.file == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !force && time.Since(t.checked) < time.Second {
		return t.fileErr
	}
	t.checked = time.Now()
	st, err := os.Stat(t.file)
	if errors.Is(err, os.ErrNotExist) {
		t.fromFile, t.fileStamp, t.fileErr = nil, "", nil
		return nil
	}
	if err != nil {
		t.fileErr = fmt.Errorf("auth.token_file: %w", err)
		return t.fileErr
	}
	stamp := fmt.Sprintf("%d/%d", st.Size(), st.ModTime().UnixNano())
	if stamp == t.fileStamp {
		return nil
	}
	toks, err := ReadTokenFile(t.file)
	if err != nil {
		t.fileErr = err
		return err
	}
	t.fromFile, t.fileStamp, t.fileErr = toks, stamp, nil
	return nil
}

// ReadTokenFile parses a token file: one "name:sha256:HEX" per line, blank
// lines and # comments skipped.
func ReadTokenFile(path string) ([]Token, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth.token_file: %w", err)
	}
	defer f.Close()
	var out []Token
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ":")
		if len(parts) != 3 || parts[1] != "sha256" {
			return nil, fmt.Errorf("auth.token_file %s line %d: want name:sha256:HEX (`airlock token add NAME` writes one)", path, n)
		}
		tok, err := ParseTokenHash(parts[0], parts[2])
		if err != nil {
			return nil, fmt.Errorf("auth.token_file %s line %d: %w", path, n, err)
		}
		out = append(out, tok)
	}
	return out, sc.Err()
}

// Empty reports whether no token is configured at all.
func (t *Tokens) Empty() bool {
	_ = t.reload(false)
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.static)+len(t.fromFile) == 0
}

// Lookup returns the name of the token whose secret is secret. Every
// token is compared, in constant time, so timing tells nothing.
func (t *Tokens) Lookup(secret string) (string, bool) {
	_ = t.reload(false)
	sum := sha256.Sum256([]byte(secret))
	t.mu.Lock()
	all := append(append([]Token(nil), t.static...), t.fromFile...)
	t.mu.Unlock()
	name := ""
	for _, tok := range all {
		if subtle.ConstantTimeCompare(sum[:], tok.Hash[:]) == 1 {
			name = tok.Name
		}
	}
	return name, name != ""
}

// NewSecret makes a new random bearer token and the line that stores it.
func NewSecret(name string) (secret, line string, err error) {
	if _, err := ParseTokenHash(name, strings.Repeat("0", 64)); err != nil {
		return "", "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	secret = "alk_" + base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(secret))
	return secret, fmt.Sprintf("%s:sha256:%s", name, hex.EncodeToString(sum[:])), nil
}

// Principal is who an HTTP request comes from, as the transport proved it.
type Principal struct {
	// ID is the client identity: "token:NAME", "uid:1000(alice)".
	ID        string
	Transport string
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal an authenticating middleware set.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// requireToken lets a request through only with a valid bearer token, and
// records who it is. While no token is configured at all, anonymousOK lets
// everyone through unnamed (loopback, or the operator's explicit choice).
func requireToken(tokens *Tokens, anonymousOK bool, transport string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		secret = strings.TrimSpace(secret)
		if ok && tokens != nil && tokens.Empty() {
			// The file is re-read at most once a second; a token presented
			// just after `airlock token add` must not pass as anonymous.
			_ = tokens.reload(true)
		}
		if (tokens == nil || tokens.Empty()) && anonymousOK {
			next.ServeHTTP(w, r)
			return
		}
		name, found := "", false
		if ok && tokens != nil {
			if name, found = tokens.Lookup(secret); !found && tokens.reload(true) == nil {
				name, found = tokens.Lookup(secret)
			}
		}
		if !found {
			desc := "a bearer token is required"
			if ok {
				desc = "the bearer token is not valid"
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="airlock", error="invalid_token", error_description=%q`, desc))
			http.Error(w, "Unauthorized: "+desc+" (Authorization: Bearer <token>; `airlock token add NAME` makes one)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), Principal{ID: "token:" + name, Transport: transport})))
	})
}
