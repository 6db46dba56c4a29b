package kube

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/airlock-mcp/airlock/config"
)

func TestContainerID(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"containerd://0123abcd", "0123abcd"},
		{"cri-o://ffee", "ffee"},
		{"bare", "bare"},
		{"", ""},
	} {
		if got := containerID(&corev1.ContainerStatus{ContainerID: c.in}); got != c.want {
			t.Errorf("containerID(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if containerID(nil) != "" {
		t.Error("a pod without a status has a container id")
	}
}

// Monitoring is on only with the agent's port and a usable token; a bad
// token file names the key to fix.
func TestMonitorOptions(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	_ = os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	_ = os.WriteFile(short, []byte("abc"), 0o600)
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name    string
		edit    func(*config.Config)
		on      bool
		wantErr string
	}{
		{"no agent port", func(*config.Config) {}, false, ""},
		{"monitoring off", func(c *config.Config) {
			c.Monitor.Enabled, c.Kubernetes.MonitorAgentPort, c.Kubernetes.MonitorAgentTokenFile = false, 9477, good
		}, false, ""},
		{"on", func(c *config.Config) {
			c.Kubernetes.MonitorAgentPort, c.Kubernetes.MonitorAgentTokenFile = 9477, good
			c.Monitor.KillOn = []string{"mount"}
		}, true, ""},
		{"missing token file", func(c *config.Config) {
			c.Kubernetes.MonitorAgentPort, c.Kubernetes.MonitorAgentTokenFile = 9477, filepath.Join(dir, "none")
		}, false, "kubernetes.monitor_agent_token_file"},
		{"short token", func(c *config.Config) {
			c.Kubernetes.MonitorAgentPort, c.Kubernetes.MonitorAgentTokenFile = 9477, short
		}, false, "at least 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Defaults()
			c.edit(&cfg)
			mo, err := monitorOptions(cfg, log)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || (mo != nil) != c.on {
				t.Fatalf("options %+v, err %v; want on=%v", mo, err, c.on)
			}
			if c.on && (mo.Port != 9477 || mo.Token != "0123456789abcdef0123" || len(mo.KillOn) != 1) {
				t.Errorf("options %+v", mo)
			}
		})
	}
}
