package monitor

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
)

// contextFields are collected on every point. container_id is the only way to
// tell which sandbox (run) an event belongs to: the handshake does not say.
var contextFields = []string{"container_id"}

// The JSON shapes below mirror runsc's boot.InitConfig and seccheck's
// SessionConfig/PointConfig/SinkConfig (runsc/boot/seccheck.go,
// pkg/sentry/seccheck/config.go). runsc decodes the file with
// DisallowUnknownFields, so only fields it knows may appear.
type initConfig struct {
	TraceSession sessionConfig `json:"trace_session"`
}

type sessionConfig struct {
	Name string `json:"name"`
	// IgnoreMissing stays false (omitted): a misspelt point must make
	// sandbox creation fail rather than silently watch less.
	Points []pointConfig `json:"points"`
	Sinks  []sinkConfig  `json:"sinks"`
}

type pointConfig struct {
	Name          string   `json:"name"`
	ContextFields []string `json:"context_fields"`
}

type sinkConfig struct {
	Name   string         `json:"name"`
	Config map[string]any `json:"config"`
	// IgnoreSetupError is false on purpose and written out explicitly: if
	// the listener is down, runsc create fails instead of running the
	// sandbox unwatched.
	IgnoreSetupError bool `json:"ignore_setup_error"`
}

// PointNames returns the trace points the classifier needs on this
// architecture, sorted.
func PointNames() ([]string, error) {
	t := hostArch
	if t == nil {
		return nil, fmt.Errorf("runtime monitoring: no syscall table for %s", runtime.GOARCH)
	}
	return t.pointNames(), nil
}

func (t *archTable) pointNames() []string {
	names := append([]string(nil), t.named...)
	for sysno, r := range t.raw {
		dir := "enter"
		if r.exit {
			dir = "exit"
		}
		names = append(names, fmt.Sprintf("syscall/sysno/%d/%s", sysno, dir))
	}
	sort.Strings(names)
	return names
}

// Config returns the content of the file given to runsc's global
// --pod-init-config flag: a "Default" trace session with the points the
// classifier needs, each collecting container_id, and one remote sink
// connecting to endpoint (the path of a [Listener]'s socket).
//
// The remote sink is left with its default of no retries: when the socket
// buffer is full the sentry drops the event (counted, see
// Options.OnDropped) instead of stalling the sandboxed thread.
func Config(endpoint string) ([]byte, error) {
	if endpoint == "" {
		return nil, errors.New("runtime monitoring config: empty endpoint")
	}
	names, err := PointNames()
	if err != nil {
		return nil, err
	}
	return buildConfig(endpoint, names)
}

func buildConfig(endpoint string, names []string) ([]byte, error) {
	points := make([]pointConfig, 0, len(names))
	for _, n := range names {
		points = append(points, pointConfig{Name: n, ContextFields: contextFields})
	}
	cfg := initConfig{TraceSession: sessionConfig{
		// seccheck accepts only this session name.
		Name:   "Default",
		Points: points,
		Sinks: []sinkConfig{{
			Name:   "remote",
			Config: map[string]any{"endpoint": endpoint},
		}},
	}}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("runtime monitoring config: %w", err)
	}
	return out, nil
}
