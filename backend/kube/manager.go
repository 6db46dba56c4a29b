package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/exchange"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Labels on everything this backend creates. Cleanup finds pods by these
// and by owner references, never by name.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "airlock"
	LabelInstance  = "airlock.dev/instance"
	LabelRun       = "airlock.dev/run"
	// LabelSession names the session a session pod serves.
	LabelSession = "airlock.dev/session"
	// LabelNetwork marks a pod with a network ("allowlist"): the sandbox
	// namespace's NetworkPolicy lets only these reach the egress proxy.
	LabelNetwork = "airlock.dev/network"
)

// NetOptions are what networked runs need.
type NetOptions struct {
	// RuntimeClass is gVisor with a network stack; runs without a network
	// keep Options.RuntimeClass, which has none.
	RuntimeClass string
	// Proxy is this replica's egress proxy; each networked pod is
	// registered with it by address for its run.
	Proxy *egress.Server
	// Policy is the operator's allow-list (a call may narrow it).
	Policy egress.Policy
	// Secrets and Tripwires are what calls may be given (tools binds them).
	Secrets   *egress.Secrets
	Tripwires bool
	// Addr is the proxy as pods reach it: an IP, since they have no
	// resolver. A session's relay dials it; runs are told its URL.
	Addr     netip.AddrPort
	CABundle []byte
}

// URL is the proxy's address as code in a pod is told it (HTTP_PROXY).
func (n *NetOptions) URL() string { return "http://" + n.Addr.String() }

// Options configure a Manager.
type Options struct {
	Client kubernetes.Interface
	// REST is the client's configuration, for the attach streams.
	REST      *rest.Config
	Namespace string
	// InstanceID names this airlock process: its Lease owns its pods.
	InstanceID string
	// Address is where the other replicas reach this one's MCP endpoint
	// (host:port), published on its Lease; empty: not reachable.
	Address       string
	Image         string
	RuntimeClass  string
	NodeSelector  map[string]string
	Tolerations   []corev1.Toleration
	SchedulerName string
	// ScheduleTimeout bounds how long a pod may wait for a node; past it,
	// the run fails and counts for the breaker.
	ScheduleTimeout time.Duration
	// LeaseDuration is the instance Lease's (0: 30 s); see lease.go.
	LeaseDuration time.Duration
	UID, GID      uint32
	// Env is extra fixed variables the operator grants every sandbox.
	Env map[string]string
	// PoolSize warm pods wait per instance, their drivers started with
	// PoolPreload imported, made with PoolLimits; 0 turns the pool off.
	PoolSize    int
	PoolLimits  runtime.Limits
	PoolPreload []string
	PoolMaxIdle time.Duration
	// MaxTimeout is the longest a run may last (a warm pod's deadline must
	// leave room for it).
	MaxTimeout time.Duration
	// Concurrency, Queue and QueueWait bound runs, as locally.
	Concurrency, Queue int
	QueueWait          time.Duration
	Breaker            runtime.BreakerOptions
	// Net offers networked runs; nil: none.
	Net *NetOptions
	// Monitor turns on runtime monitoring through the nodes' agents; nil:
	// none.
	Monitor *MonitorOptions
	Log     *slog.Logger
}

// Manager runs each request in a pod of its own under gVisor, on a
// Kubernetes cluster. It implements runtime.Manager.
type Manager struct {
	o         Options
	admission *runtime.Admission
	breaker   *runtime.Breaker
	lease     *instanceLease
	pool      *pool // nil when PoolSize is 0
	teardowns runtime.Teardowns
	// trips are the networked runs and sessions a tripwire can end.
	trips runtime.Targets[*pod]
	// leaving marks this instance's Lease once it shuts down (handoff.go).
	leaving    sync.Once
	leavingErr error
	// handOn is whether sessions released at shutdown go to another
	// airlock: asked once, for all of them (handoff.go).
	handOn    sync.Once
	handOnOK  bool
	handOnErr error
}

// New checks the options and registers this instance (its Lease, which
// owns every pod it makes, so the garbage collector removes them when the
// Lease goes: at Close, or when another instance finds it expired).
func New(ctx context.Context, o Options) (*Manager, error) {
	switch {
	case o.Client == nil || o.REST == nil:
		return nil, errors.New("kubernetes backend: no client")
	case o.Namespace == "" || o.InstanceID == "":
		return nil, errors.New("kubernetes backend: namespace and instance id are required")
	case o.Concurrency < 1:
		return nil, errors.New("kubernetes backend: concurrency must be at least 1")
	case o.ScheduleTimeout <= 0:
		return nil, errors.New("kubernetes backend: kubernetes.schedule_timeout must be positive")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = defaultLeaseDuration
	}
	if o.LeaseDuration < 3*time.Second {
		return nil, errors.New("kubernetes backend: kubernetes.lease_duration must be at least 3s")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	quietClientGo(o.Log)
	m := &Manager{o: o,
		admission: runtime.NewAdmission(o.Concurrency, o.Queue, o.QueueWait),
		breaker:   runtime.NewBreaker(o.Breaker),
	}
	if o.Net != nil {
		o.Net.Proxy.OnTripwire(m.tripwire)
	}
	l, err := startLease(ctx, o.Client, o.Namespace, o.InstanceID, o.Address, o.LeaseDuration, m.sweep, o.Log)
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: %w", err)
	}
	m.lease = l
	if o.PoolSize > 0 {
		m.pool = newPool(m)
	}
	return m, nil
}

// Admission is the manager's run admission (for metrics).
func (m *Manager) Admission() *runtime.Admission { return m.admission }

// Breaker is the manager's circuit breaker.
func (m *Manager) Breaker() *runtime.Breaker { return m.breaker }

// WaitTeardowns waits until every pod of a finished run is gone.
func (m *Manager) WaitTeardowns() { m.teardowns.Wait() }

// Run implements runtime.Manager: a new pod for the run, the code in over
// the pod's attach stream, the pod deleted afterwards (holding the run's
// slot until it is gone).
func (m *Manager) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if req.RunID == "" {
		req.RunID = runtime.NewRunID()
	}
	res := runtime.Result{RunID: req.RunID}
	if req.Language != runtime.Python && req.Language != runtime.Shell {
		return res, fmt.Errorf("unknown language %q", req.Language)
	}
	// Before a pod is taken for it (exchange.Run checks again).
	if err := runtime.CheckOverlay(req.Env, req.HomeFiles); err != nil {
		return res, err
	}
	networked := req.Egress != nil
	if networked && m.o.Net == nil {
		return res, errors.New("runtime: this airlock offers no networked runs on the cluster (set kubernetes.network_runtime_class and network.allow_domains)")
	}
	release, err := m.admission.Acquire(ctx)
	if err != nil {
		return res, err
	}
	log := m.o.Log.With("run", req.RunID)
	start := time.Now()
	var p *pod
	// Warm pods have no network; a networked run always gets a new pod.
	if !networked && m.pool != nil && m.pool.limits.SameSandbox(req.Limits) {
		p = m.pool.take(ctx, req.RunID)
	}
	warm := p != nil
	if p == nil {
		if p, err = m.create(ctx, req.RunID, req.Limits, req.Egress); err != nil {
			release()
			return res, err
		}
	}
	defer m.teardowns.Start(p.destroy, release)
	startRun := time.Now()
	var files map[string][]byte
	if networked {
		// The pod was registered with the proxy as it started; its
		// teardown unregisters it before the pod goes.
		files = runtime.ProxyFiles(m.o.Net.URL(), m.o.Net.CABundle)
	}
	res, err = exchange.Run(ctx, p, req, files, false)
	err = p.noteAttempts(&res, err, false)
	if networked {
		res.EgressDenied = m.o.Net.Proxy.Denials(req.RunID)
	}
	res.Warm = warm
	if res.Timings != nil {
		res.Timings["acquired_sandbox"] = runtime.Millis(startRun.Sub(start))
		for k, v := range p.steps {
			res.Timings["create."+k] = v
		}
	}
	log.Info("run finished", "backend", "kubernetes", "pod", p.name, "warm", warm, "lang", req.Language, "exit", res.ExitCode, "reason", res.Reason, "took", res.Duration, "total", time.Since(start))
	return res, err
}

// create makes a pod for a run and waits until its driver says hello,
// through the breaker.
func (m *Manager) create(ctx context.Context, runID string, lim runtime.Limits, pol *egress.Policy) (p *pod, err error) {
	err = m.breaker.Guard(ctx, func() error {
		p, err = m.startPod(ctx, runID, lim, pol)
		return err
	})
	if err != nil {
		return nil, err
	}
	metrics.SandboxStart.WithLabelValues("cold").Observe(time.Since(p.created).Seconds())
	return p, nil
}

// Close deletes every pod this instance still has, then its Lease; when
// no other airlock stays on the namespace, it also ends the sessions no
// one holds (handoff.go). It does not wait for the kubelet to finish with
// them: a stdio server must leave within a desktop client's two seconds.
func (m *Manager) Close(ctx context.Context) error {
	if m.pool != nil {
		m.pool.stop()
	}
	err := m.endUnheld(ctx)
	if err != nil {
		err = fmt.Errorf("end the sessions no airlock is left to serve: %w", err)
	}
	err = errors.Join(err, m.lease.stop(ctx))
	if m.o.Net != nil {
		err = errors.Join(err, m.o.Net.Proxy.Close())
	}
	return err
}

// register lets the pod's address through this replica's egress proxy
// under pol, with its refusals kept under id, until the pod's letGo.
func (m *Manager) register(p *pod, id string, pol egress.Policy) error {
	ip, err := netip.ParseAddr(p.ip)
	if err != nil {
		return runtime.Infra("sandbox pod address", fmt.Errorf("%q: %w", p.ip, err))
	}
	forget := m.trips.Arm(id, p)
	unreg := m.o.Net.Proxy.Register(ip, id, pol)
	unregister := func() { unreg(); forget() }
	p.letGo() // a registration this pod had: replaced
	p.unregister.Store(&unregister)
	return nil
}

// EgressCredentials are the secrets calls may ask for and whether
// networked runs get tripwires.
func (m *Manager) EgressCredentials() (*egress.Secrets, bool) {
	if m.o.Net == nil {
		return nil, false
	}
	return m.o.Net.Secrets, m.o.Net.Tripwires
}

// EgressPolicy is the operator's allow-list when networked runs are
// offered; nil otherwise.
func (m *Manager) EgressPolicy() *egress.Policy {
	if m.o.Net == nil {
		return nil
	}
	pol := m.o.Net.Policy
	return &pol
}
