package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"

	"github.com/airlock-mcp/airlock/approval"
)

func TestDefaultsAreValid(t *testing.T) {
	if err := Defaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

// The shipped config.yaml must state exactly the built-in defaults.
func TestShippedConfigMatchesDefaults(t *testing.T) {
	c, err := Load(viper.New(), filepath.Join("..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	if c.Limits != d.Limits || c.StateDir != d.StateDir || c.Image != d.Image || c.Runtime.Shim != d.Runtime.Shim ||
		c.Containerd != d.Containerd || c.Sandbox.UID != d.Sandbox.UID || c.Log != d.Log ||
		c.Approval.Mode != d.Approval.Mode || c.Approval.Timeout != d.Approval.Timeout || !reflect.DeepEqual(c.Approval.Console, d.Approval.Console) || c.Audit != d.Audit ||
		c.Server.Listen != d.Server.Listen || c.Server.Socket != d.Server.Socket || c.Server.ShutdownGrace != d.Server.ShutdownGrace ||
		c.Server.ProgressInterval != d.Server.ProgressInterval || c.TLS != d.TLS || c.Auth.TokenFile != d.Auth.TokenFile || c.Auth.AllowUnauthenticated ||
		c.Pool.Size != d.Pool.Size || c.Pool.MaxIdleAge != d.Pool.MaxIdleAge || strings.Join(c.Pool.Preload, ",") != strings.Join(d.Pool.Preload, ",") ||
		c.Sessions != d.Sessions || c.Files != d.Files || c.Rich != d.Rich {
		t.Errorf("config.yaml = %+v\ndefaults    = %+v", c, d)
	}
}

func TestEnvOverrides(t *testing.T) {
	t.Setenv("AIRLOCK_LIMITS_TIMEOUT_S", "7")
	t.Setenv("AIRLOCK_CONTAINERD_ADDRESS", "/run/x.sock")
	c, err := Load(viper.New(), filepath.Join("..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.TimeoutS != 7 || c.Containerd.Address != "/run/x.sock" {
		t.Errorf("env not applied: timeout %d address %q", c.Limits.TimeoutS, c.Containerd.Address)
	}
}

func TestValidateNamesTheKey(t *testing.T) {
	cases := map[string]func(*Config){
		"server.advertise":      func(c *Config) { c.Server.Advertise = "10.0.0.7" },
		"limits.timeout_s":      func(c *Config) { c.Limits.TimeoutS = 0 },
		"limits.max_timeout_s":  func(c *Config) { c.Limits.MaxTimeoutS = 1; c.Limits.TimeoutS = 5 },
		"limits.memory_mb":      func(c *Config) { c.Limits.MemoryMB = 1 },
		"limits.pids":           func(c *Config) { c.Limits.Pids = 0 },
		"limits.concurrency":    func(c *Config) { c.Limits.Concurrency = 0 },
		"runtime.shim":          func(c *Config) { c.Runtime.Shim = "runc" },
		"sandbox.uid":           func(c *Config) { c.Sandbox.UID = 0 },
		"sessions.idle_timeout": func(c *Config) { c.Sessions.MaxLifetime = time.Second },
		"sessions.max":          func(c *Config) { c.Sessions.Max = 1; c.Sessions.PerClient = 2 },
		"files.max_file_mb":     func(c *Config) { c.Files.MaxFileMB = 64 },
		"rich.*":                func(c *Config) { c.Rich.EmbedTotalKB = 1 },
		"state_dir":             func(c *Config) { c.StateDir = "relative" },
		"sandbox.env":           func(c *Config) { c.Sandbox.Env = map[string]string{"A=B": "x"} },
		"approval.timeout":      func(c *Config) { c.Approval.Timeout = 120 },
		"approval.grantable_domains": func(c *Config) {
			c.Approval.GrantableDomains = []string{"example.org"}
		},
		"approval.mode": func(c *Config) { c.Approval.Mode = "sometimes" },
		"approval.rules": func(c *Config) {
			c.Approval.Mode = "rules"
			c.Approval.Rules = []approval.RuleConfig{{Tool: "run_python"}}
		},
		"audit.path":      func(c *Config) { c.Audit.Path = "audit.jsonl" },
		"runtime.backend": func(c *Config) { c.Runtime.Backend = "docker" },
		"kubernetes.namespace": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.Namespace = "Sandboxes"
		},
		"kubernetes.runtime_class": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.RuntimeClass = ""
		},
		"kubernetes.schedule_timeout": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.ScheduleTimeout = 60
		},
		"kubernetes.lease_duration": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.LeaseDuration = time.Second
		},
		"kubernetes.qps": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.QPS = 0
		},
		"kubernetes.burst": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Kubernetes.Burst = 10
		},
		"kubernetes.network_runtime_class": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Network.AllowDomains = []string{"pypi.org"}
		},
		"kubernetes.network_runtime_class must differ": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Network.AllowDomains = []string{"pypi.org"}
			c.Kubernetes.NetworkRuntimeClass = c.Kubernetes.RuntimeClass
		},
		"kubernetes.egress_listen": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Network.AllowDomains = []string{"pypi.org"}
			c.Kubernetes.NetworkRuntimeClass, c.Kubernetes.EgressListen = "gvisor-net", "3128"
		},
		"kubernetes.egress_address": func(c *Config) {
			c.Runtime.Backend = BackendKubernetes
			c.Network.AllowDomains = []string{"pypi.org"}
			c.Kubernetes.NetworkRuntimeClass, c.Kubernetes.EgressAddress = "gvisor-net", "airlock-egress.airlock:3128"
		},
		"monitor.kill_on":                     func(c *Config) { c.Monitor.KillOn = []string{"mount", "mounts"} },
		"kubernetes.monitor_agent_port":       func(c *Config) { c.Kubernetes.MonitorAgentPort = 70000 },
		"kubernetes.monitor_agent_token_file": func(c *Config) { c.Kubernetes.MonitorAgentPort = 9477 },
	}
	for key, mutate := range cases {
		t.Run(key, func(t *testing.T) {
			c := Defaults()
			mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), key) {
				t.Errorf("err = %v, want it to name %s", err, key)
			}
		})
	}
}

func TestLoadReportsBadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	_ = os.WriteFile(p, []byte("limits: [1,2"), 0o600)
	if _, err := Load(viper.New(), p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("err = %v, want it to name the file", err)
	}
}

func TestApprovalFromFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	_ = os.WriteFile(p, []byte(`approval:
  mode: rules
  timeout: 45s
  rules:
    - {name: offline python, tool: run_python, network: none, max_code_bytes: 4096, action: approve}
    - {network: allowlist, action: ask}
  grantable_domains: ["*.example.org"]
`), 0o600)
	c, err := Load(viper.New(), p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Approval.Timeout.Seconds() != 45 || len(c.Approval.Rules) != 2 || c.Approval.Rules[0].MaxCodeBytes != 4096 || c.Approval.Rules[1].Action != "ask" {
		t.Errorf("approval = %+v", c.Approval)
	}
	if !c.NetworkOffered() {
		t.Error("grantable domains must make a network available")
	}
}

// The hosted example must load as it is shipped.
func TestHostedExampleLoads(t *testing.T) {
	c, err := Load(viper.New(), filepath.Join("..", "examples", "config.hosted.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Listen != "0.0.0.0:8765" || c.Limits.Concurrency != 8 || c.Approval.Mode != "rules" {
		t.Errorf("hosted example = %+v", c)
	}
}

// audit.stdout without audit.path means no file: a replica's emptyDir is
// no place for the only copy of its records.
func TestAuditFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stdout bool
		path   string
		want   string
	}{
		{"file only, default path", false, "", "/state/audit.jsonl"},
		{"file only, set path", false, "/logs/a.jsonl", "/logs/a.jsonl"},
		{"stdout only", true, "", ""},
		{"stdout and a file", true, "/logs/a.jsonl", "/logs/a.jsonl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			c.StateDir = "/state"
			c.Audit.Stdout, c.Audit.Path = tc.stdout, tc.path
			if got := c.AuditFile(); got != tc.want {
				t.Errorf("AuditFile() = %q, want %q", got, tc.want)
			}
		})
	}
}

// network.allow and secrets decode from YAML into the egress package's
// shapes, with the keys the README names.
func TestAllowRulesAndSecretsDecode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	yaml := `network:
  allow_domains: [pypi.org]
  tripwires: true
  allow:
    - {domain: api.github.com, methods: [GET, HEAD], paths: [/repos/]}
    - {domain: hooks.example.com, ports: [8443]}
secrets:
  - {name: GITHUB_TOKEN, from_env: GH, hosts: [api.github.com], header: Authorization, format: "Bearer {}"}
  - {name: BODY, from_file: /etc/x, hosts: [api.github.com], in_body: true}
`
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(viper.New(), path)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Network
	if !n.Tripwires || len(n.Allow) != 2 || n.Allow[0].Domain != "api.github.com" || strings.Join(n.Allow[0].Methods, ",") != "GET,HEAD" ||
		strings.Join(n.Allow[0].Paths, ",") != "/repos/" || len(n.Allow[1].Ports) != 1 || n.Allow[1].Ports[0] != 8443 {
		t.Errorf("network = %+v", n)
	}
	if len(c.Secrets) != 2 || c.Secrets[0].Format != "Bearer {}" || c.Secrets[0].FromEnv != "GH" || !c.Secrets[1].InBody || c.Secrets[1].FromFile != "/etc/x" {
		t.Errorf("secrets = %+v", c.Secrets)
	}
	// Rules alone offer a network.
	c.Network.AllowDomains = nil
	if !c.Network.Enabled() {
		t.Error("network.allow alone does not enable networked runs")
	}
}
