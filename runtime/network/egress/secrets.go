package egress

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Denial reasons of secrets and tripwires. The first and last are the
// names the tool result uses for them.
const (
	ReasonSecretWrongHost = "secret_to_wrong_host"
	ReasonSecretPlainHTTP = "secret over plain HTTP"
	ReasonTripwire        = "exfiltration_tripwire"
)

// ErrUnknownSecret is wrapped when a call asks for a secret the operator
// has not configured.
var ErrUnknownSecret = errors.New("no such secret")

// placeholderPrefix starts every placeholder, so that a sandbox's value is
// recognisable in logs as "not the secret".
const placeholderPrefix = "airlock-placeholder-"

// minSecretLen: responses are redacted by searching for the value, and a
// short value would redact ordinary text.
const minSecretLen = 8

// SecretSpec is one `secrets:` entry as the operator writes it.
type SecretSpec struct {
	Name     string   `mapstructure:"name" json:"name"`
	FromFile string   `mapstructure:"from_file" json:"from_file,omitempty"`
	FromEnv  string   `mapstructure:"from_env" json:"from_env,omitempty"`
	Hosts    []string `mapstructure:"hosts" json:"hosts"`
	Header   string   `mapstructure:"header" json:"header,omitempty"`
	Format   string   `mapstructure:"format" json:"format,omitempty"`
	InBody   bool     `mapstructure:"in_body" json:"in_body,omitempty"`
}

// secret is a loaded SecretSpec.
type secret struct {
	name   string
	value  string
	hosts  []pattern
	header string
	format string // contains "{}"
	inBody bool
}

func (s *secret) forHost(host string) bool {
	return slices.ContainsFunc(s.hosts, func(p pattern) bool { return p.matches(host) })
}

// headerValue is the value the configured header gets.
func (s *secret) headerValue() string { return strings.Replace(s.format, "{}", s.value, 1) }

// Secrets are the operator's secrets, loaded once at start. Values stay
// in this process: runs get placeholders (Bind).
type Secrets struct {
	byName map[string]*secret
}

var (
	envName    = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	headerName = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)
)

// LoadSecrets reads each secret's value (from_file, or from_env through
// getenv) and checks the entry, naming it on error.
func LoadSecrets(specs []SecretSpec, getenv func(string) string) (*Secrets, error) {
	out := &Secrets{byName: map[string]*secret{}}
	for i, sp := range specs {
		where := fmt.Sprintf("secrets[%d] (%s)", i, sp.Name)
		if !envName.MatchString(sp.Name) {
			return nil, fmt.Errorf("%s: name must be an environment variable name in upper case (A-Z, 0-9, _), such as GITHUB_TOKEN", where)
		}
		if out.byName[sp.Name] != nil {
			return nil, fmt.Errorf("%s: the name is used twice", where)
		}
		var value string
		switch {
		case (sp.FromFile == "") == (sp.FromEnv == ""):
			return nil, fmt.Errorf("%s: give exactly one of from_file or from_env", where)
		case sp.FromFile != "":
			b, err := os.ReadFile(sp.FromFile)
			if err != nil {
				return nil, fmt.Errorf("%s: from_file: %w", where, err)
			}
			value = strings.TrimRight(string(b), "\r\n")
		default:
			value = getenv(sp.FromEnv)
			if value == "" {
				return nil, fmt.Errorf("%s: from_env: $%s is empty or unset in the server's environment", where, sp.FromEnv)
			}
		}
		if len(value) < minSecretLen {
			return nil, fmt.Errorf("%s: the value is shorter than %d characters; responses are redacted by searching for it, which would redact ordinary text", where, minSecretLen)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return nil, fmt.Errorf("%s: the value contains a line break or NUL, which cannot go into an HTTP header", where)
		}
		if len(sp.Hosts) == 0 {
			return nil, fmt.Errorf("%s: hosts is empty: name the hosts the secret may be sent to", where)
		}
		s := &secret{name: sp.Name, value: value, header: sp.Header, format: sp.Format, inBody: sp.InBody}
		for _, h := range sp.Hosts {
			p, err := parsePattern(h)
			if err != nil {
				return nil, fmt.Errorf("%s: hosts: %w", where, err)
			}
			s.hosts = append(s.hosts, p)
		}
		if s.header != "" && !headerName.MatchString(s.header) {
			return nil, fmt.Errorf("%s: header %q is not an HTTP header name", where, s.header)
		}
		switch {
		case s.format == "":
			s.format = "{}"
		case s.header == "":
			return nil, fmt.Errorf("%s: format is set without header; format says how the header's value is built", where)
		case strings.Count(s.format, "{}") != 1:
			return nil, fmt.Errorf("%s: format %q must contain {} exactly once (e.g. \"Bearer {}\")", where, s.format)
		}
		out.byName[sp.Name] = s
	}
	return out, nil
}

// Names lists the configured secrets, sorted.
func (s *Secrets) Names() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Hosts returns the host patterns secret name may go to.
func (s *Secrets) Hosts(name string) []string {
	sec := s.byName[name]
	if sec == nil {
		return nil
	}
	out := make([]string, len(sec.hosts))
	for i, p := range sec.hosts {
		out[i] = p.String()
	}
	return out
}

// Credentials are what one run is given: placeholders for the secrets it
// asked for, and tripwires when they are on. Env and Files go into the
// sandbox; the rest stays in the proxy through Policy.WithCredentials.
type Credentials struct {
	// Env is NAME=placeholder for each secret, and the tripwire variables.
	Env map[string]string
	// Files are paths relative to the sandbox user's home (".netrc").
	Files map[string]string
	// Names are the secrets bound, sorted: for the approval digest and
	// the audit record.
	Names []string

	bound []binding
	trips []string
}

type binding struct {
	placeholder string
	s           *secret
}

// Bind makes fresh placeholders for the named secrets. An unknown name is
// an error that lists the configured ones.
func (s *Secrets) Bind(names []string) (*Credentials, error) {
	c := &Credentials{Env: map[string]string{}, Files: map[string]string{}}
	for _, n := range names {
		var sec *secret
		if s != nil {
			sec = s.byName[n]
		}
		if sec == nil {
			known := s.Names()
			if len(known) == 0 {
				return nil, fmt.Errorf("secret %q: %w: this server has no secrets configured (secrets: in its config)", n, ErrUnknownSecret)
			}
			return nil, fmt.Errorf("secret %q: %w; configured: %s", n, ErrUnknownSecret, strings.Join(known, ", "))
		}
		if slices.Contains(c.Names, n) {
			continue
		}
		ph := placeholderPrefix + strings.ToLower(n) + "-" + randHex(16)
		c.bound = append(c.bound, binding{placeholder: ph, s: sec})
		c.Env[n] = ph
		c.Names = append(c.Names, n)
	}
	slices.Sort(c.Names)
	return c, nil
}

// AddTripwires gives the run fake credentials, unique to it, that no
// legitimate request ever carries: AWS keys and a GitHub token in the
// environment, and a ~/.netrc. They use only letters and digits, so a
// value copied into a host name is still recognisable.
func (c *Credentials) AddTripwires() {
	akid := "AKIA" + randAlnum(16, true)
	secret := randAlnum(40, false)
	gh := "ghp_" + randAlnum(36, false)
	netrc := randAlnum(32, false)
	// A real secret bound under the same name wins: it is what the code
	// was given to use.
	plant := func(value string, names ...string) {
		planted := false
		for _, name := range names {
			if _, taken := c.Env[name]; !taken {
				c.Env[name], planted = value, true
			}
		}
		if planted {
			c.trips = append(c.trips, value)
		}
	}
	// The access key id is the public half, sent in every signed AWS
	// request's header: planted for realism, not watched.
	if _, taken := c.Env["AWS_ACCESS_KEY_ID"]; !taken {
		c.Env["AWS_ACCESS_KEY_ID"] = akid
	}
	plant(secret, "AWS_SECRET_ACCESS_KEY")
	plant(gh, "GITHUB_TOKEN", "GH_TOKEN")
	c.Files[".netrc"] = "machine api.github.com\n  login airlock-bot\n  password " + netrc + "\n"
	c.trips = append(c.trips, netrc)
}

// Tripwires returns the run's fake values, for tests and the audit of a
// trip (never a real secret).
func (c *Credentials) Tripwires() []string { return slices.Clone(c.trips) }

// WithCredentials returns a copy of p that carries c into the proxy.
func (p Policy) WithCredentials(c *Credentials) Policy {
	p.creds = c
	return p
}

// HasCredentials reports whether p carries a run's secrets or tripwires,
// which live only in the process that bound them.
func (p Policy) HasCredentials() bool {
	return p.creds != nil && (len(p.creds.bound) > 0 || len(p.creds.trips) > 0)
}

// needsInterception reports whether the proxy must read requests to host
// to enforce p: an L7 rule for it, or any secret or tripwire in the run.
// A run holding a placeholder or a tripwire has all its HTTPS read,
// because either could be sent to any allowed host, and a blind tunnel
// would carry it unseen.
func (p Policy) needsInterception(host string) bool {
	if p.needsL7(host) {
		return true
	}
	return p.HasCredentials()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randAlnum(n int, upperOnly bool) string {
	const all = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	alphabet := all
	if upperOnly {
		alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	}
	out := make([]byte, n)
	for i := range out {
		k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		out[i] = alphabet[k.Int64()]
	}
	return string(out)
}
