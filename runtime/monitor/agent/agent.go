// Package agent is the node side of runtime monitoring where airlock does
// not run next to its sandboxes (a Kubernetes node): it owns the node's
// monitoring socket, which every sandbox on the node reports to through the
// runsc handler's pod-init-config, counts what each container tried, and
// serves the counts over HTTP to the airlock replica that runs the
// container, which may be on another node.
//
// It knows nothing of Kubernetes: a container id in, attempts out.
package agent

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/monitor"
)

const (
	// syncTimeout bounds how long a take waits for the container's events
	// already sent to be read.
	syncTimeout = time.Second
	// maxContainers bounds the containers counted at once; the oldest
	// untaken counts go first (a replica that died never takes them).
	maxContainers = 10000
	// keep is how long an untaken count is kept.
	keep = 2 * time.Hour
	// maxWatchers bounds the event streams open on one container.
	maxWatchers = 4
)

// validID is what a container id may look like: containerd's CRI ids are
// 64 hex digits; anything else is refused before it reaches a map.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Options configures an [Agent].
type Options struct {
	// Token is the bearer token every request must carry (required):
	// counts are how a replica learns what its code tried, and whoever
	// could take them could hide an attempt.
	Token string
	// OnEvent sees every attempt (metrics, logs); it must return quickly.
	OnEvent func(monitor.Event)
	// OnDropped sees the events a sandbox's sentry had to drop.
	OnDropped func(containerID string, n uint64)
	Log       *slog.Logger
}

// Agent counts attempts by container and serves them.
type Agent struct {
	o  Options
	ln *monitor.Listener

	mu   sync.Mutex
	byID map[string]*container
}

// container is one container's untaken attempts and its open streams.
type container struct {
	attempts runtime.Attempts
	seen     time.Time
	watchers map[chan monitor.Event]struct{}
}

// New listens on the monitoring socket at path.
func New(path string, o Options) (*Agent, error) {
	if o.Token == "" {
		return nil, errors.New("monitor agent: a token is required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	a := &Agent{o: o, byID: map[string]*container{}}
	ln, err := monitor.Listen(path, monitor.Options{
		OnEvent:   a.event,
		OnDropped: o.OnDropped,
		OnMalformed: func(id string, err error) {
			o.Log.Warn("runtime monitoring: a malformed message from a sandbox, skipped", "container", id, "err", err)
		},
		OnConnClosed: func(id string, err error) {
			if err != nil {
				o.Log.Warn("runtime monitoring: a sandbox's connection failed; its attempts are no longer seen", "container", id, "err", err)
			}
		},
		Log: o.Log,
	})
	if err != nil {
		return nil, fmt.Errorf("monitor agent: %w", err)
	}
	a.ln = ln
	return a, nil
}

// Close stops listening (sandboxes created after this fail to start, as
// ignore_setup_error false wants).
func (a *Agent) Close() error { return a.ln.Close() }

func (a *Agent) event(e monitor.Event) {
	if e.ContainerID == "" || !validID.MatchString(e.ContainerID) {
		return
	}
	if a.o.OnEvent != nil {
		a.o.OnEvent(e)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.containerLocked(e.ContainerID, time.Now())
	c.attempts.Add(string(e.Kind), e.Syscall)
	for ch := range c.watchers {
		select {
		case ch <- e:
		default: // a slow reader still gets the count at its take
		}
	}
}

// containerLocked returns id's entry, making room for it.
func (a *Agent) containerLocked(id string, now time.Time) *container {
	c := a.byID[id]
	if c == nil {
		if len(a.byID) >= maxContainers {
			a.evictLocked(now)
		}
		c = &container{watchers: map[chan monitor.Event]struct{}{}}
		a.byID[id] = c
	}
	c.seen = now
	return c
}

// evictLocked drops counts older than keep, or else the oldest one not
// being watched.
func (a *Agent) evictLocked(now time.Time) {
	var oldest string
	for id, c := range a.byID {
		if len(c.watchers) > 0 {
			continue
		}
		if now.Sub(c.seen) > keep {
			delete(a.byID, id)
			continue
		}
		if oldest == "" || c.seen.Before(a.byID[oldest].seen) {
			oldest = id
		}
	}
	if len(a.byID) >= maxContainers && oldest != "" {
		delete(a.byID, oldest)
	}
}

// Take returns id's attempts since its last take, once the events its
// sentry sent so far have been read (synced false if that took too long).
func (a *Agent) Take(id string) (attempts []runtime.Attempt, synced bool) {
	synced = a.ln.Sync(id, syncTimeout)
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.byID[id]
	if c == nil {
		return nil, synced
	}
	attempts = c.attempts.Take()
	if len(c.watchers) == 0 {
		delete(a.byID, id)
	}
	return attempts, synced
}

// Handler serves the API:
//
//	POST /v1/containers/{id}/take    {"attempts": [...], "synced": true}
//	GET  /v1/containers/{id}/events  one JSON event per line as they come
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/containers/{id}/take", a.serveTake)
	mux.HandleFunc("GET /v1/containers/{id}/events", a.serveEvents)
	return a.authorized(mux)
}

func (a *Agent) authorized(next http.Handler) http.Handler {
	want := []byte("Bearer " + a.o.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			http.Error(w, "a bearer token is required (the monitor agent's token)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TakeResponse is the body of a take.
type TakeResponse struct {
	Attempts []runtime.Attempt `json:"attempts"`
	// Synced is false when the container's events were not all read in
	// time: the count may be short.
	Synced bool `json:"synced"`
}

// pathID is the request's container id, or false (and a 400) when it is
// not one.
func pathID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !validID.MatchString(id) {
		http.Error(w, "not a container id", http.StatusBadRequest)
		return "", false
	}
	return id, true
}

func (a *Agent) serveTake(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	at, synced := a.Take(id)
	if at == nil {
		at = []runtime.Attempt{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(TakeResponse{Attempts: at, Synced: synced})
}

// StreamEvent is one line of an event stream.
type StreamEvent struct {
	Kind    string `json:"kind"`
	Syscall string `json:"syscall"`
}

func (a *Agent) serveEvents(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	ch := make(chan monitor.Event, 64)
	a.mu.Lock()
	c := a.containerLocked(id, time.Now())
	if len(c.watchers) >= maxWatchers {
		a.mu.Unlock()
		http.Error(w, "too many streams on this container", http.StatusTooManyRequests)
		return
	}
	c.watchers[ch] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(c.watchers, ch)
		a.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-ch:
			if enc.Encode(StreamEvent{Kind: string(e.Kind), Syscall: e.Syscall}) != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
	}
}

// TokenOK reports whether a token is fit to guard the API.
func TokenOK(t string) error {
	if len(strings.TrimSpace(t)) < 16 {
		return errors.New("the monitor agent's token must be at least 16 characters")
	}
	return nil
}

// WritePodInitConfig writes, atomically, the trace session config whose
// remote sink is the agent's socket: the file a node's runsc.toml names
// as pod-init-config. The agent writes it at start so that the points it
// asks for are always the ones its classifier knows.
func WritePodInitConfig(path, socket string) error {
	b, err := monitor.Config(socket)
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write pod-init-config: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write pod-init-config: %w", err)
	}
	return nil
}
