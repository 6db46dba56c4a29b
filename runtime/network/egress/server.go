package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Denial reasons. Denial.Reason is always one of these strings; they are
// part of the tool result an agent sees, so they stay short and stable.
const (
	ReasonNotAllowed = "not in allow-list"
	ReasonPort       = "port not allowed"
	ReasonPrivate    = "resolves to private address"
	ReasonSNI        = "SNI mismatch"
	ReasonIPLiteral  = "IP literal not allowed"
	ReasonResolve    = "resolution failed"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxConnsPerRun         = 64
	DefaultMaxHeaderBytes         = 32 << 10
	DefaultMaxResponseHeaderBytes = 1 << 20
	DefaultMaxDenialsPerRun       = 256
	DefaultHeaderTimeout          = 10 * time.Second
	DefaultHelloTimeout           = 10 * time.Second
	DefaultResolveTimeout         = 5 * time.Second
	DefaultDialTimeout            = 10 * time.Second
	DefaultIdleTimeout            = 2 * time.Minute
)

// ErrServerClosed is returned by Serve and Listen after Close.
var ErrServerClosed = errors.New("egress: server closed")

// Denial records one refused destination of a run, for the run's result.
type Denial struct {
	Host   string // as requested, lower case, without a trailing dot
	Port   int
	Reason string // one of the Reason constants
	// Method and Path are set for a refused request the proxy could read
	// (plain HTTP, or HTTPS it intercepts).
	Method, Path string
}

// Options configure a Server. Every zero field takes the matching default,
// so Options{} is a safe production configuration.
type Options struct {
	// Resolver looks names up; default net.DefaultResolver.
	Resolver Resolver
	// Hosts pins names to addresses and takes precedence over Resolver
	// (config key network.hosts). The addresses still go through the
	// private-address check.
	Hosts map[string][]netip.Addr
	// Dialer opens upstream connections; default (&net.Dialer{}).DialContext.
	Dialer Dialer
	// AllowedPrivate exempts these prefixes from the private-address check.
	// For tests and air-gapped sites with an internal mirror only: whatever
	// is listed here becomes reachable from every sandbox whose policy
	// admits a name or CIDR pointing there. Metadata addresses and
	// IPv4-mapped addresses stay refused regardless. Default empty.
	AllowedPrivate []netip.Prefix
	// MaxConnsPerRun caps the connections one run may have open at once,
	// counted from accept, so a sandbox cannot exhaust the host's file
	// descriptors. Default DefaultMaxConnsPerRun.
	MaxConnsPerRun int
	// MaxHeaderBytes caps the request line plus headers a client may send.
	// Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxResponseHeaderBytes caps the status line plus headers read from an
	// upstream HTTP server. Default DefaultMaxResponseHeaderBytes.
	MaxResponseHeaderBytes int
	// MaxDenialsPerRun caps the distinct denials kept per run, so a loop of
	// refused requests cannot grow memory without bound.
	// Default DefaultMaxDenialsPerRun.
	MaxDenialsPerRun int
	// HeaderTimeout bounds reading the client's request head.
	HeaderTimeout time.Duration
	// HelloTimeout bounds reading the ClientHello after a CONNECT.
	HelloTimeout time.Duration
	// ResolveTimeout bounds one name lookup.
	ResolveTimeout time.Duration
	// DialTimeout bounds connecting upstream (all vetted addresses together).
	DialTimeout time.Duration
	// IdleTimeout closes a tunnel or HTTP exchange after this long without
	// a byte in either direction.
	IdleTimeout time.Duration
	// Logger receives one record per connection; default slog.Default().
	Logger *slog.Logger
	// CA signs the certificates of intercepted hosts. Without it, hosts
	// whose policy needs interception (an L7 rule, a secret, tripwires)
	// are refused rather than tunnelled unchecked.
	CA *CA
	// UpstreamRoots verify intercepted hosts' certificates; default the
	// system roots.
	UpstreamRoots *x509.CertPool
}

// Server is the egress proxy. Sandboxes reach it from their own source IP,
// which Register maps to a run and its Policy; every other source is
// refused. It serves CONNECT tunnels and absolute-URI plain HTTP requests,
// one request per client connection.
type Server struct {
	opts  Options
	hosts map[string][]netip.Addr
	log   *slog.Logger

	// ctx is cancelled by Close, abandoning lookups and dials in flight.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	sources   map[netip.Addr]*registration
	runs      map[string]*runState
	listeners map[net.Listener]struct{}
	sessions  map[*session]struct{}
	closed    bool
	wg        sync.WaitGroup
	onTrip    func(runID string, d Denial)
}

// OnTripwire sets the function called once per tripped request with the
// run id and the denial: the backend kills the run. The backend is built
// after its proxy, hence a setter.
func (s *Server) OnTripwire(fn func(runID string, d Denial)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onTrip = fn
}

// registration binds one source IP to a run's policy. Its sessions are
// closed when it is unregistered, since the sandbox behind it is gone.
type registration struct {
	src      netip.Addr
	runID    string
	policy   Policy
	run      *runState
	sessions map[*session]struct{}
}

// runState is shared by all registrations of one run id.
type runState struct {
	refs    int // live registrations
	active  int // open connections, for MaxConnsPerRun
	denials []Denial
	seen    map[Denial]struct{}
}

// New validates opts, fills in defaults and returns a Server that is not
// yet listening.
func New(opts Options) (*Server, error) {
	for name, v := range map[string]int{
		"MaxConnsPerRun": opts.MaxConnsPerRun, "MaxHeaderBytes": opts.MaxHeaderBytes,
		"MaxResponseHeaderBytes": opts.MaxResponseHeaderBytes, "MaxDenialsPerRun": opts.MaxDenialsPerRun,
	} {
		if v < 0 {
			return nil, fmt.Errorf("egress: option %s is negative (%d)", name, v)
		}
	}
	for name, v := range map[string]time.Duration{
		"HeaderTimeout": opts.HeaderTimeout, "HelloTimeout": opts.HelloTimeout,
		"ResolveTimeout": opts.ResolveTimeout, "DialTimeout": opts.DialTimeout, "IdleTimeout": opts.IdleTimeout,
	} {
		if v < 0 {
			return nil, fmt.Errorf("egress: option %s is negative (%s)", name, v)
		}
	}
	setDefault(&opts.MaxConnsPerRun, DefaultMaxConnsPerRun)
	setDefault(&opts.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&opts.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes)
	setDefault(&opts.MaxDenialsPerRun, DefaultMaxDenialsPerRun)
	setDefault(&opts.HeaderTimeout, DefaultHeaderTimeout)
	setDefault(&opts.HelloTimeout, DefaultHelloTimeout)
	setDefault(&opts.ResolveTimeout, DefaultResolveTimeout)
	setDefault(&opts.DialTimeout, DefaultDialTimeout)
	setDefault(&opts.IdleTimeout, DefaultIdleTimeout)
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Dialer == nil {
		opts.Dialer = (&net.Dialer{}).DialContext
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	priv := make([]netip.Prefix, 0, len(opts.AllowedPrivate))
	for _, p := range opts.AllowedPrivate {
		if !p.IsValid() {
			return nil, fmt.Errorf("egress: option AllowedPrivate: invalid prefix %v", p)
		}
		priv = append(priv, p.Masked())
	}
	opts.AllowedPrivate = priv
	hosts, err := normalizeHosts(opts.Hosts)
	if err != nil {
		return nil, err
	}
	opts.Hosts = nil // the normalized copy is authoritative
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		ctx:       ctx,
		cancel:    cancel,
		opts:      opts,
		hosts:     hosts,
		log:       opts.Logger,
		sources:   map[netip.Addr]*registration{},
		runs:      map[string]*runState{},
		listeners: map[net.Listener]struct{}{},
		sessions:  map[*session]struct{}{},
	}, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Listen binds addr (for example "10.88.0.1:3128", or "127.0.0.1:0" in
// tests) and serves on it in the background until Close. It returns the
// bound address.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: listen on %s: %w", addr, err)
	}
	if err := s.track(ln); err != nil {
		_ = ln.Close()
		return nil, err
	}
	go func() {
		if err := s.serve(ln); err != nil && !errors.Is(err, ErrServerClosed) {
			s.log.Error("egress: listener stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return ln.Addr(), nil
}

// Serve accepts connections on ln until Close, which it then reports as
// ErrServerClosed. It takes ownership of ln.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.track(ln); err != nil {
		_ = ln.Close()
		return err
	}
	return s.serve(ln)
}

func (s *Server) track(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	return nil
}

func (s *Server) serve(ln net.Listener) error {
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("egress: accept on %s: %w", ln.Addr(), err)
			}
			// Running out of file descriptors must not kill the proxy:
			// back off and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("egress: accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return ErrServerClosed
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(c)
	}
}

// Close stops every listener, closes every open connection and waits for
// their handlers to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.cancel()
	lns := make([]net.Listener, 0, len(s.listeners))
	for ln := range s.listeners {
		lns = append(lns, ln)
	}
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	var errs []error
	for _, ln := range lns {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("egress: close listener %s: %w", ln.Addr(), err))
		}
	}
	for _, ss := range sessions {
		ss.abort()
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// Register routes connections from sourceIP (the sandbox's address on its
// network) to runID under policy p, until the returned function is called.
// The unregister function is idempotent; it closes the registration's open
// connections and, once no registration of runID remains, forgets the
// run's denials, so read Denials before unregistering.
//
// Registering an address that is already registered replaces the old
// registration for new connections (addresses are reused once a sandbox is
// gone); the old one's unregister then leaves the new one alone.
func (s *Server) Register(sourceIP netip.Addr, runID string, p Policy) (unregister func()) {
	src := sourceIP.Unmap()
	if !src.IsValid() {
		s.log.Error("egress: register with an invalid source address; no connection will match", "run", runID)
		return func() {}
	}
	s.mu.Lock()
	run := s.runs[runID]
	if run == nil {
		run = &runState{seen: map[Denial]struct{}{}}
		s.runs[runID] = run
	}
	run.refs++
	reg := &registration{src: src, runID: runID, policy: p, run: run, sessions: map[*session]struct{}{}}
	if old := s.sources[src]; old != nil {
		s.log.Warn("egress: source address re-registered; the newer run takes over", "src", src.String(), "old_run", old.runID, "run", runID)
	}
	s.sources[src] = reg
	s.mu.Unlock()

	var once sync.Once
	return func() { once.Do(func() { s.unregister(reg) }) }
}

func (s *Server) unregister(reg *registration) {
	s.mu.Lock()
	if s.sources[reg.src] == reg {
		delete(s.sources, reg.src)
	}
	reg.run.refs--
	if reg.run.refs == 0 && s.runs[reg.runID] == reg.run {
		delete(s.runs, reg.runID)
	}
	sessions := make([]*session, 0, len(reg.sessions))
	for ss := range reg.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		ss.abort()
	}
}

// Denials returns the distinct destinations refused for runID so far, in
// the order first seen, or nil for an unknown run.
func (s *Server) Denials(runID string) []Denial {
	s.mu.Lock()
	defer s.mu.Unlock()
	run := s.runs[runID]
	if run == nil {
		return nil
	}
	return slices.Clone(run.denials)
}

// TakeDenials is Denials, and forgets them: a session's calls each report
// the denials of their own time.
func (s *Server) TakeDenials(runID string) []Denial {
	s.mu.Lock()
	defer s.mu.Unlock()
	run := s.runs[runID]
	if run == nil {
		return nil
	}
	out := run.denials
	run.denials, run.seen = nil, map[Denial]struct{}{}
	return out
}

// admission is the outcome of matching a new connection to a run.
type admission int

const (
	admitted admission = iota
	unregistered
	overLimit
)

// admit finds the registration for ss's source and takes a connection slot.
func (s *Server) admit(ss *session) admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions[ss] = struct{}{}
	reg := s.sources[ss.src]
	if reg == nil {
		return unregistered
	}
	ss.reg = reg
	if reg.run.active >= s.opts.MaxConnsPerRun {
		return overLimit
	}
	reg.run.active++
	ss.counted = true
	reg.sessions[ss] = struct{}{}
	return admitted
}

// release undoes admit.
func (s *Server) release(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, ss)
	if ss.reg != nil && ss.counted {
		ss.reg.run.active--
		delete(ss.reg.sessions, ss)
	}
}

// recordDenial adds d to the run's list unless it is already there or the
// list is full.
func (s *Server) recordDenial(reg *registration, d Denial) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run := reg.run
	if _, dup := run.seen[d]; dup || len(run.denials) >= s.opts.MaxDenialsPerRun {
		return
	}
	run.seen[d] = struct{}{}
	run.denials = append(run.denials, d)
}
