// Package config holds airlock's settings: their defaults, how they are read
// (config.yaml, --config, AIRLOCK_* environment variables, flags) and how they
// are checked. Every key here is documented in the repository's config.yaml.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/viper"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/runtime/monitor"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Shim names accepted by runtime.shim.
const (
	ShimAuto  = "auto"
	ShimRunc  = "io.containerd.runc.v2"  // containerd's runc shim with runsc as its binary
	ShimRunsc = "io.containerd.runsc.v1" // gVisor's own shim
)

// DefaultImage is the reference `airlock image build` tags.
const DefaultImage = "airlock.local/sandbox:bookworm"

// Config is the whole of airlock's configuration.
type Config struct {
	StateDir   string           `mapstructure:"state_dir"`
	Log        LogConfig        `mapstructure:"log"`
	Containerd ContainerdConfig `mapstructure:"containerd"`
	Runtime    RuntimeConfig    `mapstructure:"runtime"`
	Kubernetes KubernetesConfig `mapstructure:"kubernetes"`
	Image      string           `mapstructure:"image"`
	Limits     Limits           `mapstructure:"limits"`
	Sandbox    SandboxConfig    `mapstructure:"sandbox"`
	Network    NetworkConfig    `mapstructure:"network"`
	Approval   ApprovalConfig   `mapstructure:"approval"`
	Audit      AuditConfig      `mapstructure:"audit"`
	Monitor    MonitorConfig    `mapstructure:"monitor"`
	Pool       PoolConfig       `mapstructure:"pool"`
	Sessions   SessionsConfig   `mapstructure:"sessions"`
	Files      FilesConfig      `mapstructure:"files"`
	Tasks      TasksConfig      `mapstructure:"tasks"`
	Rich       RichConfig       `mapstructure:"rich"`
	Server     ServerConfig     `mapstructure:"server"`
	TLS        TLSConfig        `mapstructure:"tls"`
	Auth       AuthConfig       `mapstructure:"auth"`
	Breaker    BreakerConfig    `mapstructure:"breaker"`
	Metrics    MetricsConfig    `mapstructure:"metrics"`
	// Secrets are values sandboxes never see: a call that asks for one
	// gets a placeholder, which the egress proxy replaces on requests to
	// the secret's hosts.
	Secrets []egress.SecretSpec `mapstructure:"secrets"`
}

// BreakerConfig is the circuit breaker in front of sandbox creation.
type BreakerConfig struct {
	// Failures of sandbox creation or start within Window open the
	// breaker; 0 turns it off.
	Failures int           `mapstructure:"failures"`
	Window   time.Duration `mapstructure:"window"`
	// Cooldown is how long an open breaker refuses before one probe.
	Cooldown time.Duration `mapstructure:"cooldown"`
}

// MetricsConfig is the Prometheus endpoint of stdio deployments (the HTTP
// transports serve /metrics on their own listener).
type MetricsConfig struct {
	// Listen is a loopback address for /metrics; empty: none.
	Listen string `mapstructure:"listen"`
}

// PoolConfig is the warm pool of sandboxes.
type PoolConfig struct {
	// Size is how many warm sandboxes wait per network mode; 0 disables.
	Size int `mapstructure:"size"`
	// MaxIdleAge retires a warm sandbox that waited this long.
	MaxIdleAge time.Duration `mapstructure:"max_idle_age"`
	// Preload are the Python modules a warm sandbox has imported already.
	Preload []string `mapstructure:"preload"`
	// Restore makes warm sandboxes, and cold ones with the default
	// limits and no network, by restoring a checkpoint of a warm one
	// instead of booting (local backend, runc shim).
	Restore bool `mapstructure:"restore"`
}

// SessionsConfig bounds stateful sessions.
type SessionsConfig struct {
	// IdleTimeout ends a session nobody used for this long; a session may
	// ask for less.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// MaxLifetime ends a session this long after it began.
	MaxLifetime time.Duration `mapstructure:"max_lifetime"`
	PerClient   int           `mapstructure:"per_client"`
	Max         int           `mapstructure:"max"`
	// PauseAfter checkpoints a session idle this long to state_dir and
	// frees its sandbox; its next call restores it. 0 never pauses.
	PauseAfter time.Duration `mapstructure:"pause_after"`
	// CheckpointMB bounds the disk paused sessions take; the oldest
	// paused sessions end first past it.
	CheckpointMB int `mapstructure:"checkpoint_mb"`
}

// TasksConfig bounds the runs clients make MCP tasks of.
type TasksConfig struct {
	// ResultTTL is how long a task's result is kept after its run ends.
	ResultTTL time.Duration `mapstructure:"result_ttl"`
	// MaxKept bounds the ended tasks kept per client; the oldest go first.
	MaxKept int `mapstructure:"max_kept"`
}

// FilesConfig bounds write_file and read_file; the workspace as a whole is
// bounded by limits.workspace_mb.
type FilesConfig struct {
	MaxFileMB int `mapstructure:"max_file_mb"`
}

// RichConfig bounds what a Python run returns besides its output.
type RichConfig struct {
	DisplayKB    int `mapstructure:"display_kb"`
	MaxImages    int `mapstructure:"max_images"`
	ImageKB      int `mapstructure:"image_kb"`
	MaxFiles     int `mapstructure:"max_files"`
	EmbedKB      int `mapstructure:"embed_kb"`
	EmbedTotalKB int `mapstructure:"embed_total_kb"`
}

// ServerConfig is how airlock serves MCP over the network and to local
// unprivileged clients.
type ServerConfig struct {
	// Listen is the TCP address of the HTTP transports; empty: none.
	Listen string `mapstructure:"listen"`
	// Socket is the Unix socket `airlock connect` relays to; empty: none.
	Socket string `mapstructure:"socket"`
	// SocketGroup may use the socket (mode 0660); root always may.
	SocketGroup string `mapstructure:"socket_group"`
	// ShutdownGrace is how long runs may finish after SIGTERM.
	ShutdownGrace time.Duration `mapstructure:"shutdown_grace"`
	// AllowedOrigins are browser origins allowed besides the server's own.
	AllowedOrigins []string `mapstructure:"allowed_origins"`
	// ProgressInterval is the least time between two progress notifications
	// of one run.
	ProgressInterval time.Duration `mapstructure:"progress_interval"`
	// SessionKeyFile holds a key shared by replicas behind one Service, so
	// any of them serves a streamable HTTP session another opened; empty:
	// sessions stay on the process that opened them.
	SessionKeyFile string `mapstructure:"session_key_file"`
	// Advertise is where the other replicas reach this one's MCP endpoint
	// (host:port, plain HTTP); on Kubernetes, the pod's IP and port. A
	// 2025-11-25 client's reply that reaches the wrong replica is handed
	// to the right one there. Empty: replies are not handed on.
	Advertise string `mapstructure:"advertise"`
}

// TLSConfig serves the HTTP transports over TLS when both are set.
type TLSConfig struct {
	Cert string `mapstructure:"cert"`
	Key  string `mapstructure:"key"`
}

// AuthConfig is bearer-token authentication of the HTTP transports.
type AuthConfig struct {
	// Tokens are named SHA-256 hashes of bearer tokens.
	Tokens []TokenConfig `mapstructure:"tokens"`
	// TokenFile holds more, one "name:sha256:HEX" per line; re-read when it changes.
	TokenFile string `mapstructure:"token_file"`
	// AllowUnauthenticated lets a non-loopback listener run without tokens.
	AllowUnauthenticated bool `mapstructure:"allow_unauthenticated"`
}

// TokenConfig is one client's token, stored as its hash.
type TokenConfig struct {
	Name   string `mapstructure:"name"`
	SHA256 string `mapstructure:"sha256"`
}

// ApprovalConfig says when a human must approve a run and how they are asked.
type ApprovalConfig struct {
	// Mode is off, always or rules.
	Mode  string                `mapstructure:"mode"`
	Rules []approval.RuleConfig `mapstructure:"rules"`
	// Timeout is how long a request waits for a decision before it is denied.
	Timeout time.Duration `mapstructure:"timeout"`
	// GrantableDomains are domains outside network.allow_domains that an
	// approver may grant to one call that asks for them.
	GrantableDomains []string      `mapstructure:"grantable_domains"`
	Console          ConsoleConfig `mapstructure:"console"`
}

// ConsoleConfig is the web approval console.
type ConsoleConfig struct {
	// Listen is the console's address; empty disables it.
	Listen string `mapstructure:"listen"`
	// TokenFile holds the approver tokens; empty means state_dir/approver.tokens.
	TokenFile string `mapstructure:"token_file"`
	// Hosts are more Host header values (host:port) the console answers
	// to, such as a Service's or an ingress's name.
	Hosts []string `mapstructure:"hosts"`
}

// Enabled reports whether any run may need a human.
func (a ApprovalConfig) Enabled() bool { return a.Mode != "" && a.Mode != string(approval.ModeOff) }

// AuditConfig is the audit log of every call.
type AuditConfig struct {
	Enabled bool `mapstructure:"enabled"`
	// Path of the JSON Lines log; empty means state_dir/audit.jsonl.
	Path        string `mapstructure:"path"`
	IncludeCode bool   `mapstructure:"include_code"`
	// MaxMB is the size at which the log rotates (three old files are kept).
	MaxMB int `mapstructure:"max_mb"`
	// Stdout also writes every record to stdout, one JSON line each, for a
	// cluster's log pipeline; then only an explicit Path adds a file.
	Stdout bool `mapstructure:"stdout"`
	// SealEvery writes a signed seal into the log after this many records
	// (and always at shutdown); 0 seals only at shutdown.
	SealEvery int `mapstructure:"seal_every"`
}

// knownKinds reports whether every one of kinds is a monitor.Kind.
func knownKinds(kinds []string) bool {
	for _, k := range kinds {
		if !slices.Contains(monitor.Kinds(), monitor.Kind(k)) {
			return false
		}
	}
	return true
}

// MonitorConfig is gVisor's runtime monitoring of what sandboxed code
// tries (mounts, module loads, ptrace, ...).
type MonitorConfig struct {
	// Enabled starts every sandbox with a trace session reporting to
	// airlock (the runc shim's sandboxes; a sandbox whose report cannot be
	// set up is not started).
	Enabled bool `mapstructure:"enabled"`
	// KillOn ends a run at the first attempt of one of these kinds, with
	// reason policy_violation.
	KillOn []string `mapstructure:"kill_on"`
}

// Network modes a call may ask for.
const (
	NetworkNone      = "none"
	NetworkAllowlist = "allowlist"
)

// NetworkConfig is the egress policy: which names a sandbox may reach
// through the egress proxy, and the private network that carries it.
type NetworkConfig struct {
	// Mode is the default for calls that do not ask: none or allowlist.
	Mode string `mapstructure:"mode"`
	// AllowDomains is the operator's allow-list (pypi.org, *.example.com). A
	// call may narrow it, never widen it. Empty: no call gets a network.
	AllowDomains []string `mapstructure:"allow_domains"`
	AllowPorts   []int    `mapstructure:"allow_ports"`
	// AllowCIDRs admits IP-literal destinations in these ranges.
	AllowCIDRs []string `mapstructure:"allow_cidrs"`
	// Hosts is a static host map the proxy's resolver consults first.
	Hosts []HostEntry `mapstructure:"hosts"`
	// AllowPrivate exempts ranges from the proxy's private-address refusal:
	// for tests and air-gapped sites only.
	AllowPrivate []string `mapstructure:"allow_private"`
	Bridge       string   `mapstructure:"bridge"`
	Subnet       string   `mapstructure:"subnet"`
	// Table names the nftables tables (inet and bridge) of the firewall.
	// Two deployments on one host need their own bridge, subnet and table.
	Table     string `mapstructure:"table"`
	ProxyPort int    `mapstructure:"proxy_port"`
	// CAFile is a PEM bundle the sandbox trusts in addition to the system's.
	CAFile string `mapstructure:"ca_file"`
	// Allow are allow-list entries with request rules (methods, paths,
	// ports); each also allows its domain, as allow_domains does.
	Allow []egress.AllowRule `mapstructure:"allow"`
	// Tripwires plants unique fake credentials in every networked sandbox
	// and kills a run that sends one anywhere.
	Tripwires bool `mapstructure:"tripwires"`
}

// HostEntry maps one name to addresses in network.hosts.
type HostEntry struct {
	Name  string   `mapstructure:"name"`
	Addrs []string `mapstructure:"addrs"`
}

// Enabled reports whether networked runs can be offered at all.
func (n NetworkConfig) Enabled() bool {
	return len(n.AllowDomains) > 0 || len(n.AllowCIDRs) > 0 || len(n.Allow) > 0
}

// LogConfig says where and how airlock logs. Logs always go to stderr:
// stdout belongs to the stdio transport.
type LogConfig struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// ContainerdConfig selects the containerd daemon.
type ContainerdConfig struct {
	// Address of an external daemon's socket; empty starts an embedded one.
	Address   string `mapstructure:"address"`
	Namespace string `mapstructure:"namespace"`
	// Binary is the containerd executable the embedded daemon runs.
	Binary string `mapstructure:"binary"`
}

// RuntimeConfig selects how gVisor is started.
type RuntimeConfig struct {
	// Backend runs sandboxes: containerd on this host, or pods on a
	// Kubernetes cluster (kubernetes.*).
	Backend    string   `mapstructure:"backend"`
	Shim       string   `mapstructure:"shim"`
	Runsc      string   `mapstructure:"runsc"`
	RunscFlags []string `mapstructure:"runsc_flags"`
	// DirectFS lets the sandbox open files on the host itself (runsc's
	// --directfs): faster file access, but the sandbox process is then host
	// uid 0 with file capabilities. Off, it is nobody in a user namespace
	// of its own and the gofer opens files for it.
	DirectFS bool `mapstructure:"directfs"`
}

// Backends accepted by runtime.backend.
const (
	BackendContainerd = "containerd"
	BackendKubernetes = "kubernetes"
)

// KubernetesConfig is the Kubernetes backend: where its pods go and how
// they are placed.
type KubernetesConfig struct {
	// Kubeconfig is a kubeconfig file; empty: the in-cluster service account.
	Kubeconfig string `mapstructure:"kubeconfig"`
	// Namespace holds the sandbox pods (and the instances' Leases).
	Namespace string `mapstructure:"namespace"`
	// RuntimeClass names the RuntimeClass whose handler is gVisor.
	RuntimeClass string `mapstructure:"runtime_class"`
	// Image is the sandbox image on the nodes; empty: the top-level image.
	Image         string             `mapstructure:"image"`
	NodeSelector  map[string]string  `mapstructure:"node_selector"`
	Tolerations   []TolerationConfig `mapstructure:"tolerations"`
	SchedulerName string             `mapstructure:"scheduler_name"`
	// ScheduleTimeout bounds how long a sandbox pod may wait for a node.
	ScheduleTimeout time.Duration `mapstructure:"schedule_timeout"`
	// LeaseDuration is how long an instance's Lease lasts unrenewed; an
	// instance silent for twice as long is dead to the others, which
	// remove its pods.
	LeaseDuration time.Duration `mapstructure:"lease_duration"`
	// QPS and Burst bound this instance's requests to the API server (a
	// token bucket: Burst at once, QPS a second after). client-go's own
	// default, 5 a second, would cap a replica at a few runs a second.
	QPS   float64 `mapstructure:"qps"`
	Burst int     `mapstructure:"burst"`
	// NetworkRuntimeClass is the RuntimeClass of networked sandbox pods:
	// gVisor with a network stack (runsc's network "sandbox"). Empty: no
	// networked runs on the cluster.
	NetworkRuntimeClass string `mapstructure:"network_runtime_class"`
	// EgressListen is where this replica's egress proxy listens.
	EgressListen string `mapstructure:"egress_listen"`
	// EgressAddress is the host:port networked pods dial for the proxy;
	// empty: $POD_IP (the downward API) and EgressListen's port.
	EgressAddress string `mapstructure:"egress_address"`
	// MonitorAgentPort is the port of `airlock monitor-agent` on every
	// node (host network): the node side of runtime monitoring, which the
	// sandbox RuntimeClasses' runsc reports to. 0: no runtime monitoring
	// on the cluster.
	MonitorAgentPort int `mapstructure:"monitor_agent_port"`
	// MonitorAgentTokenFile holds the bearer token the agents require.
	MonitorAgentTokenFile string `mapstructure:"monitor_agent_token_file"`
}

// TolerationConfig is one toleration of sandbox pods, as in a pod spec.
type TolerationConfig struct {
	Key      string `mapstructure:"key"`
	Operator string `mapstructure:"operator"`
	Value    string `mapstructure:"value"`
	Effect   string `mapstructure:"effect"`
}

// SandboxImage is the image sandbox pods run.
func (k KubernetesConfig) SandboxImage(image string) string {
	if k.Image != "" {
		return k.Image
	}
	return image
}

// Limits are the per-run resource limits and the server-wide concurrency cap.
type Limits struct {
	TimeoutS    int     `mapstructure:"timeout_s"`
	MaxTimeoutS int     `mapstructure:"max_timeout_s"`
	MemoryMB    int     `mapstructure:"memory_mb"`
	CPUs        float64 `mapstructure:"cpus"`
	Pids        int     `mapstructure:"pids"`
	StdoutBytes int     `mapstructure:"stdout_bytes"`
	StderrBytes int     `mapstructure:"stderr_bytes"`
	CodeBytes   int     `mapstructure:"code_bytes"`
	WorkspaceMB int     `mapstructure:"workspace_mb"`
	TmpMB       int     `mapstructure:"tmp_mb"`
	Concurrency int     `mapstructure:"concurrency"`
	// Queue is how many calls may wait for a sandbox when all are busy, each
	// for at most QueueWaitS; past that a call is answered "busy" at once.
	Queue      int `mapstructure:"queue"`
	QueueWaitS int `mapstructure:"queue_wait_s"`
	// PerClientConcurrency and PerClientRunsPerMinute bound one client.
	PerClientConcurrency   int `mapstructure:"per_client_concurrency"`
	PerClientRunsPerMinute int `mapstructure:"per_client_runs_per_minute"`
}

// SandboxConfig is what the code inside a sandbox sees.
type SandboxConfig struct {
	UID int `mapstructure:"uid"`
	GID int `mapstructure:"gid"`
	// Env holds extra fixed variables the operator grants every sandbox.
	// Nothing of the server's own environment is ever passed.
	Env map[string]string `mapstructure:"env"`
}

// Defaults returns the built-in configuration, the same as config.yaml.
func Defaults() Config {
	return Config{
		StateDir:   "/var/lib/airlock",
		Log:        LogConfig{Level: "info", Format: "text"},
		Containerd: ContainerdConfig{Namespace: "airlock", Binary: "containerd"},
		Runtime:    RuntimeConfig{Backend: BackendContainerd, Shim: ShimAuto, Runsc: "runsc"},
		Kubernetes: KubernetesConfig{Namespace: "airlock-sandboxes", RuntimeClass: "gvisor", NodeSelector: map[string]string{}, ScheduleTimeout: 60 * time.Second, LeaseDuration: 30 * time.Second, QPS: 100, Burst: 200, EgressListen: ":3128"},
		Image:      DefaultImage,
		Limits: Limits{
			TimeoutS:    30,
			MaxTimeoutS: 300,
			MemoryMB:    512,
			CPUs:        1,
			Pids:        128,
			StdoutBytes: 64 << 10,
			StderrBytes: 64 << 10,
			CodeBytes:   1 << 20,
			WorkspaceMB: 64,
			TmpMB:       64,
			Concurrency: 4,
			Queue:       16,
			QueueWaitS:  30,

			PerClientConcurrency:   4,
			PerClientRunsPerMinute: 120,
		},
		Sandbox: SandboxConfig{UID: 1000, GID: 1000, Env: map[string]string{}},
		Network: NetworkConfig{
			Mode:       NetworkNone,
			AllowPorts: []int{80, 443},
			Bridge:     "airlock0",
			Subnet:     "10.89.0.0/24",
			Table:      "airlock",
			ProxyPort:  3128,
		},
		Approval: ApprovalConfig{
			Mode:    string(approval.ModeOff),
			Timeout: 120 * time.Second,
			Console: ConsoleConfig{Listen: "127.0.0.1:8766", Hosts: []string{}},
		},
		Audit:    AuditConfig{Enabled: true, IncludeCode: true, MaxMB: 100, SealEvery: 100},
		Monitor:  MonitorConfig{Enabled: true, KillOn: []string{}},
		Pool:     PoolConfig{Size: 2, MaxIdleAge: 10 * time.Minute, Preload: []string{"numpy", "pandas"}, Restore: true},
		Sessions: SessionsConfig{IdleTimeout: 10 * time.Minute, MaxLifetime: 2 * time.Hour, PerClient: 4, Max: 16, PauseAfter: 2 * time.Minute, CheckpointMB: 4096},
		Files:    FilesConfig{MaxFileMB: 8},
		Tasks:    TasksConfig{ResultTTL: 15 * time.Minute, MaxKept: 100},
		Rich:     RichConfig{DisplayKB: 64, MaxImages: 4, ImageKB: 1024, MaxFiles: 100, EmbedKB: 64, EmbedTotalKB: 256},
		Breaker:  BreakerConfig{Failures: 5, Window: time.Minute, Cooldown: 30 * time.Second},
		Server: ServerConfig{
			Listen:           "127.0.0.1:8765",
			Socket:           "/run/airlock/airlock.sock",
			SocketGroup:      "airlock",
			ShutdownGrace:    30 * time.Second,
			AllowedOrigins:   []string{},
			ProgressInterval: 250 * time.Millisecond,
		},
	}
}

// SetDefaults registers every default with v, so environment variables and
// flags can override keys that no file sets.
func SetDefaults(v *viper.Viper) {
	d := Defaults()
	v.SetDefault("state_dir", d.StateDir)
	v.SetDefault("log.level", d.Log.Level)
	v.SetDefault("log.format", d.Log.Format)
	v.SetDefault("containerd.address", d.Containerd.Address)
	v.SetDefault("containerd.namespace", d.Containerd.Namespace)
	v.SetDefault("containerd.binary", d.Containerd.Binary)
	v.SetDefault("runtime.backend", d.Runtime.Backend)
	v.SetDefault("runtime.shim", d.Runtime.Shim)
	v.SetDefault("kubernetes.kubeconfig", d.Kubernetes.Kubeconfig)
	v.SetDefault("kubernetes.namespace", d.Kubernetes.Namespace)
	v.SetDefault("kubernetes.runtime_class", d.Kubernetes.RuntimeClass)
	v.SetDefault("kubernetes.image", d.Kubernetes.Image)
	v.SetDefault("kubernetes.node_selector", d.Kubernetes.NodeSelector)
	v.SetDefault("kubernetes.tolerations", d.Kubernetes.Tolerations)
	v.SetDefault("kubernetes.scheduler_name", d.Kubernetes.SchedulerName)
	v.SetDefault("kubernetes.schedule_timeout", d.Kubernetes.ScheduleTimeout)
	v.SetDefault("kubernetes.lease_duration", d.Kubernetes.LeaseDuration)
	v.SetDefault("kubernetes.qps", d.Kubernetes.QPS)
	v.SetDefault("kubernetes.burst", d.Kubernetes.Burst)
	v.SetDefault("kubernetes.network_runtime_class", d.Kubernetes.NetworkRuntimeClass)
	v.SetDefault("kubernetes.monitor_agent_port", d.Kubernetes.MonitorAgentPort)
	v.SetDefault("kubernetes.monitor_agent_token_file", d.Kubernetes.MonitorAgentTokenFile)
	v.SetDefault("kubernetes.egress_listen", d.Kubernetes.EgressListen)
	v.SetDefault("kubernetes.egress_address", d.Kubernetes.EgressAddress)
	v.SetDefault("runtime.runsc", d.Runtime.Runsc)
	v.SetDefault("runtime.runsc_flags", d.Runtime.RunscFlags)
	v.SetDefault("runtime.directfs", d.Runtime.DirectFS)
	v.SetDefault("image", d.Image)
	v.SetDefault("limits.timeout_s", d.Limits.TimeoutS)
	v.SetDefault("limits.max_timeout_s", d.Limits.MaxTimeoutS)
	v.SetDefault("limits.memory_mb", d.Limits.MemoryMB)
	v.SetDefault("limits.cpus", d.Limits.CPUs)
	v.SetDefault("limits.pids", d.Limits.Pids)
	v.SetDefault("limits.stdout_bytes", d.Limits.StdoutBytes)
	v.SetDefault("limits.stderr_bytes", d.Limits.StderrBytes)
	v.SetDefault("limits.code_bytes", d.Limits.CodeBytes)
	v.SetDefault("limits.workspace_mb", d.Limits.WorkspaceMB)
	v.SetDefault("limits.tmp_mb", d.Limits.TmpMB)
	v.SetDefault("limits.concurrency", d.Limits.Concurrency)
	v.SetDefault("limits.queue", d.Limits.Queue)
	v.SetDefault("limits.queue_wait_s", d.Limits.QueueWaitS)
	v.SetDefault("limits.per_client_concurrency", d.Limits.PerClientConcurrency)
	v.SetDefault("limits.per_client_runs_per_minute", d.Limits.PerClientRunsPerMinute)
	v.SetDefault("sandbox.uid", d.Sandbox.UID)
	v.SetDefault("sandbox.gid", d.Sandbox.GID)
	v.SetDefault("sandbox.env", d.Sandbox.Env)
	v.SetDefault("network.mode", d.Network.Mode)
	v.SetDefault("network.allow_domains", d.Network.AllowDomains)
	v.SetDefault("network.allow_ports", d.Network.AllowPorts)
	v.SetDefault("network.allow_cidrs", d.Network.AllowCIDRs)
	v.SetDefault("network.hosts", d.Network.Hosts)
	v.SetDefault("network.allow_private", d.Network.AllowPrivate)
	v.SetDefault("network.bridge", d.Network.Bridge)
	v.SetDefault("network.subnet", d.Network.Subnet)
	v.SetDefault("network.table", d.Network.Table)
	v.SetDefault("network.proxy_port", d.Network.ProxyPort)
	v.SetDefault("network.ca_file", d.Network.CAFile)
	v.SetDefault("network.allow", d.Network.Allow)
	v.SetDefault("network.tripwires", d.Network.Tripwires)
	v.SetDefault("secrets", d.Secrets)
	v.SetDefault("approval.mode", d.Approval.Mode)
	v.SetDefault("approval.rules", d.Approval.Rules)
	v.SetDefault("approval.timeout", d.Approval.Timeout)
	v.SetDefault("approval.grantable_domains", d.Approval.GrantableDomains)
	v.SetDefault("approval.console.listen", d.Approval.Console.Listen)
	v.SetDefault("approval.console.token_file", d.Approval.Console.TokenFile)
	v.SetDefault("approval.console.hosts", d.Approval.Console.Hosts)
	v.SetDefault("audit.enabled", d.Audit.Enabled)
	v.SetDefault("audit.path", d.Audit.Path)
	v.SetDefault("audit.include_code", d.Audit.IncludeCode)
	v.SetDefault("audit.max_mb", d.Audit.MaxMB)
	v.SetDefault("audit.stdout", d.Audit.Stdout)
	v.SetDefault("audit.seal_every", d.Audit.SealEvery)
	v.SetDefault("monitor.enabled", d.Monitor.Enabled)
	v.SetDefault("monitor.kill_on", d.Monitor.KillOn)
	v.SetDefault("pool.size", d.Pool.Size)
	v.SetDefault("pool.max_idle_age", d.Pool.MaxIdleAge)
	v.SetDefault("pool.preload", d.Pool.Preload)
	v.SetDefault("pool.restore", d.Pool.Restore)
	v.SetDefault("sessions.idle_timeout", d.Sessions.IdleTimeout)
	v.SetDefault("sessions.max_lifetime", d.Sessions.MaxLifetime)
	v.SetDefault("sessions.per_client", d.Sessions.PerClient)
	v.SetDefault("sessions.max", d.Sessions.Max)
	v.SetDefault("sessions.pause_after", d.Sessions.PauseAfter)
	v.SetDefault("tasks.result_ttl", d.Tasks.ResultTTL)
	v.SetDefault("tasks.max_kept", d.Tasks.MaxKept)
	v.SetDefault("sessions.checkpoint_mb", d.Sessions.CheckpointMB)
	v.SetDefault("files.max_file_mb", d.Files.MaxFileMB)
	v.SetDefault("rich.display_kb", d.Rich.DisplayKB)
	v.SetDefault("rich.max_images", d.Rich.MaxImages)
	v.SetDefault("rich.image_kb", d.Rich.ImageKB)
	v.SetDefault("rich.max_files", d.Rich.MaxFiles)
	v.SetDefault("rich.embed_kb", d.Rich.EmbedKB)
	v.SetDefault("rich.embed_total_kb", d.Rich.EmbedTotalKB)
	v.SetDefault("server.listen", d.Server.Listen)
	v.SetDefault("server.socket", d.Server.Socket)
	v.SetDefault("server.socket_group", d.Server.SocketGroup)
	v.SetDefault("server.shutdown_grace", d.Server.ShutdownGrace)
	v.SetDefault("server.allowed_origins", d.Server.AllowedOrigins)
	v.SetDefault("server.progress_interval", d.Server.ProgressInterval)
	v.SetDefault("server.session_key_file", d.Server.SessionKeyFile)
	v.SetDefault("server.advertise", d.Server.Advertise)
	v.SetDefault("tls.cert", d.TLS.Cert)
	v.SetDefault("tls.key", d.TLS.Key)
	v.SetDefault("auth.tokens", d.Auth.Tokens)
	v.SetDefault("auth.token_file", d.Auth.TokenFile)
	v.SetDefault("auth.allow_unauthenticated", d.Auth.AllowUnauthenticated)
	v.SetDefault("breaker.failures", d.Breaker.Failures)
	v.SetDefault("breaker.window", d.Breaker.Window)
	v.SetDefault("breaker.cooldown", d.Breaker.Cooldown)
	v.SetDefault("metrics.listen", d.Metrics.Listen)
}

// Load reads the configuration. path may be empty: then ./config.yaml and
// /etc/airlock/config.yaml are tried, and none is needed. AIRLOCK_LIMITS_TIMEOUT_S
// overrides limits.timeout_s, and so on for every key.
func Load(v *viper.Viper, path string) (Config, error) {
	SetDefaults(v)
	v.SetEnvPrefix("AIRLOCK")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("read config %s: %w", path, err)
		}
	} else {
		v.SetConfigName("config")
		v.SetConfigType("yaml")
		v.AddConfigPath(".")
		v.AddConfigPath("/etc/airlock")
		if err := v.ReadInConfig(); err != nil {
			var notFound viper.ConfigFileNotFoundError
			if !errors.As(err, &notFound) {
				return Config{}, fmt.Errorf("read config: %w", err)
			}
		}
	}
	var c Config
	if err := v.Unmarshal(&c); err != nil {
		return Config{}, fmt.Errorf("decode config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// dnsLabelRE is a Kubernetes namespace name.
var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// tableNameRE is what nftables takes as a table name, as airlock uses it.
var tableNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)

// Validate reports the first setting that cannot work, naming its key.
func (c Config) Validate() error {
	l := c.Limits
	checks := []struct {
		ok  bool
		msg string
	}{
		{c.StateDir != "" && strings.HasPrefix(c.StateDir, "/"), "state_dir must be an absolute path"},
		{c.Containerd.Namespace != "", "containerd.namespace must not be empty"},
		{c.Runtime.Shim == ShimAuto || c.Runtime.Shim == ShimRunc || c.Runtime.Shim == ShimRunsc,
			fmt.Sprintf("runtime.shim must be %q, %q or %q", ShimAuto, ShimRunc, ShimRunsc)},
		{c.Image != "", "image must name an image reference"},
		{c.Server.Advertise == "" || validHostPort(c.Server.Advertise), fmt.Sprintf("server.advertise %q must be host:port, e.g. 10.0.0.7:8765", c.Server.Advertise)},
		{c.Runtime.Backend == BackendContainerd || c.Runtime.Backend == BackendKubernetes,
			fmt.Sprintf("runtime.backend must be %q or %q", BackendContainerd, BackendKubernetes)},
		{c.Runtime.Backend != BackendKubernetes || dnsLabelRE.MatchString(c.Kubernetes.Namespace),
			"kubernetes.namespace must be a namespace name (lower-case letters, digits and -, at most 63)"},
		{c.Runtime.Backend != BackendKubernetes || c.Kubernetes.RuntimeClass != "",
			"kubernetes.runtime_class must name the RuntimeClass whose handler is gVisor (sandbox pods never run without it)"},
		{c.Runtime.Backend != BackendKubernetes || c.Kubernetes.ScheduleTimeout >= time.Second,
			"kubernetes.schedule_timeout must be at least 1s (write it with a unit: 60s)"},
		{c.Runtime.Backend != BackendKubernetes || (c.Kubernetes.LeaseDuration >= 3*time.Second && c.Kubernetes.LeaseDuration <= time.Hour),
			"kubernetes.lease_duration must be from 3s to 1h (write it with a unit: 30s)"},
		{c.Runtime.Backend != BackendKubernetes || (c.Kubernetes.QPS >= 1 && c.Kubernetes.QPS <= 10000),
			"kubernetes.qps must be from 1 to 10000 (requests a second to the API server)"},
		{c.Runtime.Backend != BackendKubernetes || (c.Kubernetes.Burst >= 1 && float64(c.Kubernetes.Burst) >= c.Kubernetes.QPS),
			"kubernetes.burst must be at least 1 and at least kubernetes.qps"},
		{c.Runtime.Backend != BackendKubernetes || !c.NetworkOffered() || c.Kubernetes.NetworkRuntimeClass != "",
			"networked runs on Kubernetes need kubernetes.network_runtime_class: a RuntimeClass whose gVisor handler keeps a network (runsc network \"sandbox\"), with the sandbox namespace's NetworkPolicies enforced (the README's Kubernetes section); or leave network.allow_domains empty"},
		{c.Kubernetes.MonitorAgentPort >= 0 && c.Kubernetes.MonitorAgentPort <= 65535,
			"kubernetes.monitor_agent_port must be a port (1-65535), or 0 for no runtime monitoring on the cluster"},
		{c.Kubernetes.MonitorAgentPort == 0 || c.Kubernetes.MonitorAgentTokenFile != "",
			"kubernetes.monitor_agent_port needs kubernetes.monitor_agent_token_file: the file with the agents' bearer token"},
		{c.Runtime.Backend != BackendKubernetes || !c.NetworkOffered() || c.Kubernetes.NetworkRuntimeClass != c.Kubernetes.RuntimeClass,
			"kubernetes.network_runtime_class must differ from kubernetes.runtime_class: runs without a network keep a handler with none"},
		{c.Runtime.Backend != BackendKubernetes || !c.NetworkOffered() || validListen(c.Kubernetes.EgressListen),
			"kubernetes.egress_listen must be host:port (\":3128\": every address of the pod)"},
		{c.Runtime.Backend != BackendKubernetes || !c.NetworkOffered() || c.Kubernetes.EgressAddress == "" || validIPOrIPPort(c.Kubernetes.EgressAddress),
			"kubernetes.egress_address must be an IP address with or without a port (egress_listen's), or empty ($POD_IP and egress_listen's port): sandboxes have no resolver"},
		{l.TimeoutS >= 1, "limits.timeout_s must be at least 1"},
		{l.MaxTimeoutS >= l.TimeoutS, "limits.max_timeout_s must be at least limits.timeout_s"},
		{l.MemoryMB >= 32, "limits.memory_mb must be at least 32"},
		{l.CPUs > 0, "limits.cpus must be greater than 0"},
		{l.Pids >= 8, "limits.pids must be at least 8"},
		{l.StdoutBytes >= 1 && l.StderrBytes >= 1, "limits.stdout_bytes and limits.stderr_bytes must be at least 1"},
		{l.CodeBytes >= 1, "limits.code_bytes must be at least 1"},
		{l.WorkspaceMB >= 1 && l.TmpMB >= 1, "limits.workspace_mb and limits.tmp_mb must be at least 1"},
		{l.Concurrency >= 1, "limits.concurrency must be at least 1"},
		{l.Queue >= 0 && l.QueueWaitS >= 0, "limits.queue and limits.queue_wait_s must not be negative"},
		{l.PerClientConcurrency >= 1, "limits.per_client_concurrency must be at least 1"},
		{l.PerClientRunsPerMinute >= 1, "limits.per_client_runs_per_minute must be at least 1"},
		{c.Pool.Size >= 0, "pool.size must not be negative (0 turns the pool off)"},
		{c.Pool.MaxIdleAge >= time.Second, "pool.max_idle_age must be at least 1s (write it with a unit: 10m)"},
		{validModules(c.Pool.Preload), "pool.preload must list Python module names (numpy, pandas, matplotlib.pyplot)"},
		{c.Sessions.IdleTimeout >= time.Second && c.Sessions.MaxLifetime >= c.Sessions.IdleTimeout,
			"sessions.idle_timeout must be at least 1s and sessions.max_lifetime at least that (write them with units: 10m, 2h)"},
		{c.Sessions.PerClient >= 0 && c.Sessions.Max >= c.Sessions.PerClient, "sessions.per_client must not be negative, and sessions.max at least that (0 turns sessions off)"},
		{c.Tasks.ResultTTL >= time.Second && c.Tasks.MaxKept >= 1, "tasks.result_ttl must be at least 1s and tasks.max_kept at least 1"},
		{c.Sessions.PauseAfter >= 0 && c.Sessions.CheckpointMB >= 1, "sessions.pause_after must not be negative (0 never pauses), and sessions.checkpoint_mb must be at least 1"},
		{c.Files.MaxFileMB >= 1 && c.Files.MaxFileMB <= 16, "files.max_file_mb must be between 1 and 16"},
		{c.Rich.DisplayKB >= 1 && c.Rich.MaxImages >= 0 && c.Rich.ImageKB >= 1 && c.Rich.MaxFiles >= 0 && c.Rich.EmbedKB >= 0 && c.Rich.EmbedTotalKB >= c.Rich.EmbedKB && c.Rich.ImageKB*c.Rich.MaxImages <= 16<<10,
			"rich.*: display_kb and image_kb at least 1, counts not negative, embed_total_kb at least embed_kb, and max_images×image_kb at most 16384"},
		{c.Server.ShutdownGrace >= 0, "server.shutdown_grace must not be negative (write it with a unit: 30s)"},
		{c.Server.ProgressInterval >= 10*time.Millisecond, "server.progress_interval must be at least 10ms (write it with a unit: 250ms)"},
		{(c.TLS.Cert == "") == (c.TLS.Key == ""), "tls.cert and tls.key must be set together"},
		{c.Network.Mode == NetworkNone || c.Network.Mode == NetworkAllowlist,
			fmt.Sprintf("network.mode must be %q or %q", NetworkNone, NetworkAllowlist)},
		{c.Network.Mode == NetworkNone || c.Network.Enabled(),
			"network.mode is allowlist but network.allow_domains is empty: list the domains sandboxes may reach"},
		{c.Network.ProxyPort > 0 && c.Network.ProxyPort < 65536, "network.proxy_port must be a TCP port"},
		{tableNameRE.MatchString(c.Network.Table), "network.table must be 1-32 of A-Z, a-z, 0-9 and _ (an nftables table name)"},
		{c.Sandbox.UID > 0 && c.Sandbox.GID > 0, "sandbox.uid and sandbox.gid must be non-zero: sandboxes never run as root"},
		{c.Approval.Timeout >= time.Second, "approval.timeout must be at least 1s (write it with a unit: 120s, 5m)"},
		{len(c.Approval.GrantableDomains) == 0 || c.Approval.Enabled(),
			"approval.grantable_domains needs approval.mode always or rules: only a human can grant a domain"},
		{c.Audit.MaxMB >= 0, "audit.max_mb must not be negative (0 disables rotation)"},
		{c.Audit.SealEvery >= 0, "audit.seal_every must not be negative (0 seals only at shutdown)"},
		{knownKinds(c.Monitor.KillOn), fmt.Sprintf("monitor.kill_on takes only these kinds: %v", monitor.Kinds())},
		{c.Breaker.Failures >= 0 && (c.Breaker.Failures == 0 || c.Breaker.Window >= time.Second && c.Breaker.Cooldown >= time.Second),
			"breaker.failures must not be negative (0 turns the breaker off), and breaker.window and breaker.cooldown at least 1s (write them with units: 60s, 30s)"},
		{c.Metrics.Listen == "" || isLoopbackAddr(c.Metrics.Listen),
			"metrics.listen serves without authentication: give it a loopback address (127.0.0.1:9464), or use the HTTP transport's /metrics, which takes bearer tokens"},
		{c.Audit.Path == "" || strings.HasPrefix(c.Audit.Path, "/"), "audit.path must be an absolute path"},
	}
	for _, ch := range checks {
		if !ch.ok {
			return fmt.Errorf("invalid config: %s", ch.msg)
		}
	}
	for i, t := range c.Auth.Tokens {
		if t.Name == "" || !isSHA256Hex(t.SHA256) {
			return fmt.Errorf("invalid config: auth.tokens[%d] needs a name and sha256 (64 hex digits); `airlock token add NAME` prints both", i)
		}
	}
	if _, err := approval.ParsePolicy(c.Approval.Mode, c.Approval.Rules); err != nil {
		return fmt.Errorf("invalid config: %w", err)
	}
	for k := range c.Sandbox.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("invalid config: sandbox.env key %q is not a valid variable name", k)
		}
	}
	return nil
}

// Timeout is the default wall-clock limit of one run.
func (l Limits) Timeout() time.Duration { return time.Duration(l.TimeoutS) * time.Second }

// ContainerdSocket is where the embedded daemon listens.
func (c Config) ContainerdSocket() string {
	return c.StateDir + "/containerd/containerd.sock"
}

func validModules(ms []string) bool {
	for _, m := range ms {
		if m == "" {
			return false
		}
		for _, r := range m {
			if !(r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
				return false
			}
		}
	}
	return true
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// QueueWait is how long a call may wait for a sandbox slot.
func (l Limits) QueueWait() time.Duration { return time.Duration(l.QueueWaitS) * time.Second }

// AuditFile is the audit log file a server writes: AuditPath, except that
// with audit.stdout and no audit.path there is none ("").
func (c Config) AuditFile() string {
	if c.Audit.Stdout && c.Audit.Path == "" {
		return ""
	}
	return c.AuditPath()
}

// AuditPath is where the audit log file is (state_dir/audit.jsonl unless
// audit.path says otherwise).
func (c Config) AuditPath() string {
	if c.Audit.Path != "" {
		return c.Audit.Path
	}
	return c.StateDir + "/audit.jsonl"
}

// AuditKeyFile is the Ed25519 key that signs the audit log's seals.
func (c Config) AuditKeyFile() string { return c.StateDir + "/audit.key" }

// AuditHeadFile keeps the head of the audit log's hash chain, beside the
// log (it is signed, so it needs no safer place than the log); "" when
// there is no log file.
func (c Config) AuditHeadFile() string {
	if f := c.AuditFile(); f != "" {
		return f + ".head"
	}
	return ""
}

// ClientTokenFile is where the HTTP transports' bearer tokens are read from.
func (c Config) ClientTokenFile() string {
	if c.Auth.TokenFile != "" {
		return c.Auth.TokenFile
	}
	return c.StateDir + "/client.tokens"
}

// ConsoleTokenFile is where the approval console's tokens are read from.
func (c Config) ConsoleTokenFile() string {
	if c.Approval.Console.TokenFile != "" {
		return c.Approval.Console.TokenFile
	}
	return c.StateDir + "/approver.tokens"
}

// HostMap is network.hosts by name (entries of one name merged).
func (n NetworkConfig) HostMap() map[string][]string {
	m := make(map[string][]string, len(n.Hosts))
	for _, h := range n.Hosts {
		m[h.Name] = append(m[h.Name], h.Addrs...)
	}
	return m
}

// NetworkOffered reports whether calls can have a network at all: the
// operator listed destinations, or an approver may grant some.
func (c Config) NetworkOffered() bool {
	return c.Network.Enabled() || (c.Approval.Enabled() && len(c.Approval.GrantableDomains) > 0)
}

// IsRoot reports whether the process runs as root, which sandboxes need.
func IsRoot() bool { return os.Geteuid() == 0 }

// isLoopbackAddr reports whether host:port binds to loopback only.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// validListen reports whether s is [host]:port with a port.
func validListen(s string) bool {
	_, p, err := net.SplitHostPort(s)
	return err == nil && p != ""
}

// validHostPort reports whether s is host:port with both parts present.
func validHostPort(s string) bool {
	h, p, err := net.SplitHostPort(s)
	return err == nil && h != "" && p != ""
}

// validIPOrIPPort reports whether s is an IP address, or an IP address
// and port.
func validIPOrIPPort(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParseAddrPort(s)
	return err == nil
}
