// Package metrics holds airlock's Prometheus metrics: one registry, the
// collectors every layer records to, and the handler that serves them in
// the text format. It is a leaf: it imports nothing of airlock's, so the
// runtime, the egress proxy and the tools can all record to it.
package metrics

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds every airlock metric and the Go and process collectors.
var Registry = prometheus.NewRegistry()

// Outcomes of a tool call, as airlock_executions_total counts them.
const (
	OutcomeOK      = "ok"      // ran and exited 0
	OutcomeFailed  = "failed"  // ran and exited non-zero (or was killed by a signal)
	OutcomeTimeout = "timeout" // ran into its timeout
	OutcomeOOM     = "out_of_memory"
)

// Limits counted by airlock_resource_limit_violations_total.
const (
	LimitTimeout = "timeout"
	LimitMemory  = "memory"
	LimitPids    = "pids"
	LimitOutput  = "output"
	LimitDisk    = "disk"
)

// Kinds of airlock_sandbox_escape_attempts_total.
const (
	// EscapeForbiddenAddress: a name that resolves to a private, loopback
	// or metadata address, or such an address asked for directly.
	EscapeForbiddenAddress = "forbidden_address"
	// EscapeIPLiteral: a destination given as an IP literal not allowed.
	EscapeIPLiteral = "ip_literal"
	// EscapeDeniedDestination: a name or port not on the allow-list.
	EscapeDeniedDestination = "denied_destination"
	// EscapeSNIMismatch: a TLS tunnel whose ClientHello names another host
	// than its CONNECT.
	EscapeSNIMismatch = "sni_mismatch"
	// EscapeUnregisteredSource: a connection to the proxy from an address
	// that is not a live sandbox's.
	EscapeUnregisteredSource = "unregistered_source"
	// EscapeSecretWrongHost: a secret's placeholder sent to a host the
	// secret does not belong to (or over plain HTTP).
	EscapeSecretWrongHost = "secret_to_wrong_host"
	// EscapeTripwire: a planted fake credential crossed the proxy.
	EscapeTripwire = "exfiltration_tripwire"
	// EscapeFirewall: packets from a sandbox the host firewall dropped:
	// anything to the gateway but the proxy port, anything forwarded.
	EscapeFirewall = "firewall_drop"
)

var (
	// Executions counts tool calls by tool and outcome: ok, failed,
	// timeout, out_of_memory for code that ran; otherwise the audit
	// outcome (invalid_arguments, not_approved, busy, client_limit,
	// cancelled, infrastructure_error, circuit_open, …).
	Executions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_executions_total",
		Help: "Tool calls by tool and outcome.",
	}, []string{"tool", "outcome"})
	// ExecutionDuration is the wall-clock time of runs that ran.
	ExecutionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "airlock_execution_duration_seconds",
		Help:    "Wall-clock time of code that ran, from the sandbox's point of view.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"tool"})
	// SandboxStart is how long a sandbox took from create to ready:
	// kind "cold" for a call's own, "pool" for a warm one made ahead.
	SandboxStart = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "airlock_sandbox_start_seconds",
		Help:    "Time from creating a sandbox to its driver being ready.",
		Buckets: []float64{.05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10, 30},
	}, []string{"kind"})
	// LimitViolations counts runs that hit a limit.
	LimitViolations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_resource_limit_violations_total",
		Help: "Runs that hit a resource limit: timeout, memory, pids, output, disk.",
	}, []string{"limit"})
	// EgressRequests counts the egress proxy's connections by decision:
	// allow, deny (policy), reject (malformed), error (upstream failed).
	EgressRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_egress_requests_total",
		Help: "Connections to the egress proxy by decision: allow, deny, reject, error.",
	}, []string{"decision"})
	// Approvals counts approval decisions: auto, approved, denied,
	// expired, cancelled.
	Approvals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "airlock_approvals_total",
		Help: "Approval decisions of calls.",
	}, []string{"decision"})
	// MonitorDropped counts gVisor runtime monitoring events a sandbox
	// could not send (its socket to airlock was full).
	MonitorDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "airlock_monitor_events_dropped_total",
		Help: "Runtime monitoring events gVisor dropped because airlock's socket was full.",
	})
)

// Escapes counts sandbox escape attempts that can be observed from
// outside the sandbox; see the Escape* kinds.
var Escapes = newEscapeCollector()

// gauges read at scrape time; set by whoever owns the state.
var (
	gaugeMu  sync.Mutex
	poolFn   func() map[string]int
	sessFn   func() int
	circuitF func() bool
)

// SetPoolReady makes airlock_pool_ready read fn (ready sandboxes by network).
func SetPoolReady(fn func() map[string]int) { gaugeMu.Lock(); poolFn = fn; gaugeMu.Unlock() }

// SetSessionsActive makes airlock_sessions_active read fn.
func SetSessionsActive(fn func() int) { gaugeMu.Lock(); sessFn = fn; gaugeMu.Unlock() }

// SetCircuitOpen makes airlock_circuit_open read fn.
func SetCircuitOpen(fn func() bool) { gaugeMu.Lock(); circuitF = fn; gaugeMu.Unlock() }

// stateCollector exports the gauges whose values live elsewhere.
type stateCollector struct{ pool, sessions, circuit *prometheus.Desc }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pool
	ch <- c.sessions
	ch <- c.circuit
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	gaugeMu.Lock()
	pf, sf, cf := poolFn, sessFn, circuitF
	gaugeMu.Unlock()
	ready := map[string]int{"none": 0, "allowlist": 0}
	if pf != nil {
		for k, v := range pf() {
			ready[k] = v
		}
	}
	for network, n := range ready {
		ch <- prometheus.MustNewConstMetric(c.pool, prometheus.GaugeValue, float64(n), network)
	}
	sessions := 0
	if sf != nil {
		sessions = sf()
	}
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(sessions))
	open := 0.0
	if cf != nil && cf() {
		open = 1
	}
	ch <- prometheus.MustNewConstMetric(c.circuit, prometheus.GaugeValue, open)
}

// escapeCollector is a counter per kind, plus the firewall's own drop
// counters read at scrape time (the kernel counts those packets).
type escapeCollector struct {
	desc     *prometheus.Desc
	mu       sync.Mutex
	counts   map[string]*atomic.Uint64
	firewall func() uint64
}

func newEscapeCollector() *escapeCollector {
	e := &escapeCollector{
		desc: prometheus.NewDesc("airlock_sandbox_escape_attempts_total",
			"Observed attempts to reach past a sandbox's limits: forbidden addresses, IP literals, denied destinations, SNI mismatches, unregistered sources at the proxy, firewall drops; and what gVisor's runtime monitoring saw (mount, namespace, module, ptrace, privilege, kernel, readonly_write, raw_socket, connect_blocked).",
			[]string{"kind"}, nil),
		counts: map[string]*atomic.Uint64{},
	}
	for _, k := range []string{EscapeForbiddenAddress, EscapeIPLiteral, EscapeDeniedDestination, EscapeSNIMismatch, EscapeUnregisteredSource, EscapeSecretWrongHost, EscapeTripwire} {
		e.counts[k] = new(atomic.Uint64)
	}
	return e
}

// Inc counts one attempt of kind.
func (e *escapeCollector) Inc(kind string) {
	e.mu.Lock()
	c := e.counts[kind]
	if c == nil {
		c = new(atomic.Uint64)
		e.counts[kind] = c
	}
	e.mu.Unlock()
	c.Add(1)
}

// Declare makes kinds appear at zero before their first attempt, so a
// dashboard sees every kind a source can count.
func (e *escapeCollector) Declare(kinds ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range kinds {
		if e.counts[k] == nil {
			e.counts[k] = new(atomic.Uint64)
		}
	}
}

// Count is the attempts of kind counted so far (firewall drops aside).
func (e *escapeCollector) Count(kind string) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.counts[kind]; c != nil {
		return c.Load()
	}
	return 0
}

// SetFirewall makes the firewall_drop kind read fn: packets the host's
// airlock tables dropped since they were installed.
func (e *escapeCollector) SetFirewall(fn func() uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.firewall = fn
}

func (e *escapeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- e.desc }

func (e *escapeCollector) Collect(ch chan<- prometheus.Metric) {
	e.mu.Lock()
	kinds := make(map[string]uint64, len(e.counts)+1)
	for k, c := range e.counts {
		kinds[k] = c.Load()
	}
	fw := e.firewall
	e.mu.Unlock()
	kinds[EscapeFirewall] = 0
	if fw != nil {
		kinds[EscapeFirewall] = fw()
	}
	for k, v := range kinds {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.CounterValue, float64(v), k)
	}
}

func init() {
	Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		Executions, ExecutionDuration, SandboxStart, LimitViolations, EgressRequests, Approvals, MonitorDropped, Escapes,
		stateCollector{
			pool:     prometheus.NewDesc("airlock_pool_ready", "Warm sandboxes ready, by network mode.", []string{"network"}, nil),
			sessions: prometheus.NewDesc("airlock_sessions_active", "Stateful sessions open.", nil, nil),
			circuit:  prometheus.NewDesc("airlock_circuit_open", "1 while the circuit breaker refuses new sandboxes.", nil, nil),
		},
	)
	// Every label value a dashboard may want appears at zero from the start.
	for _, l := range []string{LimitTimeout, LimitMemory, LimitPids, LimitOutput, LimitDisk} {
		LimitViolations.WithLabelValues(l)
	}
	for _, d := range []string{"allow", "deny", "reject", "error"} {
		EgressRequests.WithLabelValues(d)
	}
	for _, k := range []string{"cold", "pool"} {
		SandboxStart.WithLabelValues(k)
	}
	for _, tool := range []string{"run_python", "run_shell"} {
		ExecutionDuration.WithLabelValues(tool)
		for _, o := range []string{OutcomeOK, OutcomeFailed, OutcomeTimeout, OutcomeOOM} {
			Executions.WithLabelValues(tool, o)
		}
	}
	for _, d := range []string{"auto", "approved", "denied", "expired", "cancelled"} {
		Approvals.WithLabelValues(d)
	}
}

// Handler serves Registry in the Prometheus text format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{Timeout: 10 * time.Second})
}
