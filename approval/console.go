package approval

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

//go:embed consoleui
var consoleUI embed.FS

// consoleCSP allows the page its own script, style and API and nothing
// else: no inline script, so code shown on the page can never run there.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Token is one approver credential of the console. Name identifies the
// approver in decisions and the audit log.
type Token struct {
	Name   string
	Secret string
}

// ConsoleOptions configure a Console.
type ConsoleOptions struct {
	Tokens []Token
	// Hosts are the Host header values the console answers to (host:port);
	// anything else is refused, which defeats DNS rebinding.
	Hosts []string
	Log   *slog.Logger
}

// Console is the web approval channel: a page listing pending requests,
// rendered like every other channel renders them, with approve and deny
// buttons, and the JSON API behind it that `airlock approvals` also uses.
type Console struct {
	gate   *Gate
	tokens []hashedToken
	hosts  map[string]bool
	log    *slog.Logger
	mux    *http.ServeMux
}

type hashedToken struct {
	name string
	sum  [sha256.Size]byte
}

// NewConsole returns the console's HTTP handler for g. It needs at least
// one token: an unauthenticated approval page would let anyone approve.
func NewConsole(g *Gate, o ConsoleOptions) (*Console, error) {
	if len(o.Tokens) == 0 {
		return nil, errors.New("approval console: no approver token")
	}
	c := &Console{gate: g, hosts: map[string]bool{}, log: o.Log, mux: http.NewServeMux()}
	if c.log == nil {
		c.log = slog.Default()
	}
	for _, t := range o.Tokens {
		if len(t.Secret) < 16 {
			return nil, fmt.Errorf("approval console: token %q is shorter than 16 characters", t.Name)
		}
		c.tokens = append(c.tokens, hashedToken{name: t.Name, sum: sha256.Sum256([]byte(t.Secret))})
	}
	for _, h := range o.Hosts {
		c.hosts[strings.ToLower(h)] = true
	}
	c.mux.HandleFunc("GET /{$}", c.static("consoleui/index.html", "text/html; charset=utf-8"))
	c.mux.HandleFunc("GET /app.js", c.static("consoleui/app.js", "text/javascript; charset=utf-8"))
	c.mux.HandleFunc("GET /app.css", c.static("consoleui/app.css", "text/css; charset=utf-8"))
	c.mux.HandleFunc("GET /api/requests", c.authed(c.list))
	c.mux.HandleFunc("POST /api/requests/{id}/{verdict}", c.authed(c.decide))
	return c, nil
}

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if len(c.hosts) > 0 && !c.hosts[strings.ToLower(r.Host)] {
		http.Error(w, "unknown host: open the console at the address airlock listens on", http.StatusMisdirectedRequest)
		return
	}
	// A browser names the page's origin on every state-changing request; one
	// from another site is refused even before authentication.
	if origin := r.Header.Get("Origin"); origin != "" && r.Method != http.MethodGet {
		if !c.hosts[strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(origin, "http://"), "https://"))] {
			http.Error(w, "foreign origin", http.StatusForbidden)
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) static(name, ctype string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		b, err := consoleUI.ReadFile(name)
		if err != nil {
			http.Error(w, "missing asset", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", ctype)
		_, _ = w.Write(b)
	}
}

// authed runs h with the approver's name when the request carries a valid
// bearer token. Every token is compared, in constant time, so timing does
// not tell which prefix matched.
func (c *Console) authed(h func(w http.ResponseWriter, r *http.Request, approver string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		name := ""
		if ok {
			sum := sha256.Sum256([]byte(strings.TrimSpace(secret)))
			for _, t := range c.tokens {
				if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
					name = t.name
				}
			}
		}
		if name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-approvals"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong approver token (approval.console.token_file)"})
			return
		}
		h(w, r, name)
	}
}

// PendingView is a pending request as the console API returns it.
type PendingView struct {
	ID           string    `json:"id"`
	Tool         string    `json:"tool"`
	Client       string    `json:"client"`
	Transport    string    `json:"transport"`
	Session      string    `json:"session,omitempty"`
	Rule         string    `json:"rule"`
	Created      time.Time `json:"created"`
	Expires      time.Time `json:"expires"`
	Network      string    `json:"network"`
	AllowDomains []string  `json:"allow_domains"`
	Grants       []string  `json:"grants"`
	Secrets      []string  `json:"secrets,omitempty"`
	Limits       string    `json:"limits"`
	Lines        int       `json:"lines"`
	CodeBytes    int       `json:"code_bytes"`
	CodeSHA256   string    `json:"code_sha256"`
	Warnings     []string  `json:"warnings"`
	// Code is the rendered code: invisible characters made visible.
	Code string `json:"code"`
	// Numbered is Code with every line's number in a gutter, as the page
	// shows it: no line of code can pass for the page's own text.
	Numbered string `json:"numbered"`
	// Description is the whole request as plain text, as the CLI prints it.
	Description string `json:"description"`
	// Digest binds an answer to exactly these arguments (Request.Digest).
	Digest string `json:"digest"`
	// RoundTrip marks a question that went back to the client as an input
	// request: only that client's retry answers it, never a console.
	RoundTrip bool `json:"round_trip,omitempty"`
}

// Requests is the console API's answer to GET /api/requests.
type Requests struct {
	Pending []PendingView `json:"pending"`
	Recent  []Finished    `json:"recent"`
	// Partial says why other replicas' requests may be missing.
	Partial string `json:"partial,omitempty"`
}

// View turns a pending request into its API form.
func View(p *Pending) PendingView {
	r := p.Request
	rendered := p.Info.Rendered
	if rendered.Numbered == "" && r.Code != "" {
		rendered = Render(r.Code)
	}
	return PendingView{
		ID: p.ID, Tool: r.Tool, Client: r.Client, Transport: p.Info.Transport, Session: r.Session,
		Rule: p.Info.Rule, Created: p.Created.UTC(), Expires: p.Expires.UTC(),
		Network: r.Network, AllowDomains: nonNil(r.AllowDomains), Grants: nonNil(p.Info.Grants), Secrets: r.Secrets,
		Limits: DescribeLimits(r.Limits), Lines: rendered.Lines, CodeBytes: len(r.Code),
		CodeSHA256: CodeSHA256(r.Code), Warnings: nonNil(rendered.Warnings), Code: rendered.Text, Numbered: rendered.Numbered,
		Description: Describe(p), Digest: p.Digest, RoundTrip: p.Info.RoundTrip,
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (c *Console) list(w http.ResponseWriter, r *http.Request, _ string) {
	out := Requests{Pending: []PendingView{}, Recent: c.gate.Recent()}
	views, err := c.gate.Views(r.Context())
	if err != nil {
		// This replica's requests still show; the approver is told the
		// rest may be missing.
		c.log.Warn("console list without the other replicas' requests", "err", err)
		out.Partial = err.Error()
	}
	out.Pending = append(out.Pending, views...)
	writeJSON(w, http.StatusOK, out)
}

func (c *Console) decide(w http.ResponseWriter, r *http.Request, approver string) {
	id, verdict := r.PathValue("id"), r.PathValue("verdict")
	var approve bool
	switch verdict {
	case "approve":
		approve = true
	case "deny":
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "use /approve or /deny"})
		return
	}
	err := c.gate.DecideConsole(id, approve, "console:"+approver)
	switch {
	case err == nil:
		c.log.Info("approval decided", "approval_ref", Ref(id), "approved", approve, "approver", approver, "channel", ChannelConsole)
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "approved": approve, "approver": "console:" + approver})
	case errors.Is(err, ErrUnknown):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no request with that id is waiting on the console"})
	case errors.Is(err, ErrExpired):
		writeJSON(w, http.StatusGone, map[string]string{"error": "the request expired before this decision; it was denied"})
	case errors.Is(err, ErrAlreadyDecided):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ConsoleHosts are the Host header values a console listening on addr
// answers to: the address itself; on loopback, its other loopback names;
// on every address (0.0.0.0, ::), each address of this machine's
// interfaces, so that it is reachable at a pod's or host's IP; and extra,
// the names an operator routes to it (a Service, an ingress). A literal
// address is no DNS-rebinding risk: rebinding needs a name.
func ConsoleHosts(addr string, extra []string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("approval.console.listen %q: %w", addr, err)
	}
	hosts := []string{net.JoinHostPort(host, port)}
	ip := net.ParseIP(host)
	switch {
	case (ip != nil && ip.IsLoopback()) || host == "localhost":
		hosts = append(hosts, "localhost:"+port, "127.0.0.1:"+port, "[::1]:"+port)
	case host == "" || (ip != nil && ip.IsUnspecified()):
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("approval.console.listen %q: this machine's addresses: %w", addr, err)
		}
		hosts = append(hosts, "localhost:"+port)
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				hosts = append(hosts, net.JoinHostPort(n.IP.String(), port))
			}
		}
	}
	for _, h := range extra {
		if _, _, err := net.SplitHostPort(h); err != nil {
			return nil, fmt.Errorf("approval.console.hosts %q: want host:port: %w", h, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// LoadTokens reads approver tokens from path, one per line as "name:secret"
// or a bare secret (named "approver"); blank lines and # comments are
// skipped. With create set and no file present, it writes one random token
// readable only by the owner, so a fresh install has a console that only
// root can open.
func LoadTokens(path string, create bool) ([]Token, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && create {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("create approver token: %w", err)
		}
		var b [24]byte
		if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
			return nil, fmt.Errorf("create approver token: %w", err)
		}
		line := "approver:" + hex.EncodeToString(b[:]) + "\n"
		nf, cerr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if cerr == nil {
			_, cerr = nf.WriteString(line)
			if err := nf.Close(); cerr == nil {
				cerr = err
			}
		}
		// Another airlock may have created it first: then read theirs.
		if cerr != nil && !errors.Is(cerr, os.ErrExist) {
			return nil, fmt.Errorf("create approver token %s: %w", path, cerr)
		}
		f, err = os.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("approver tokens: %w", err)
	}
	defer f.Close()
	var out []Token
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, secret, ok := strings.Cut(line, ":")
		if !ok {
			name, secret = "approver", line
		}
		name, secret = strings.TrimSpace(name), strings.TrimSpace(secret)
		if name == "" || len(secret) < 16 {
			return nil, fmt.Errorf("approver tokens %s line %d: want name:secret with a secret of at least 16 characters", path, n)
		}
		out = append(out, Token{Name: name, Secret: secret})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("approver tokens %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("approver tokens %s: no token in the file", path)
	}
	return out, nil
}
