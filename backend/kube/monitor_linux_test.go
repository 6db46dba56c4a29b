package kube

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/monitor"
	"github.com/airlock-mcp/airlock/runtime/monitor/agent"
)

// The test cluster's node is this machine (scripts/cluster.sh): its
// monitored RuntimeClasses' runsc reads the config at monitorDir and
// reports to the socket there, and the node's address is nodeIP.
const (
	nodeIP       = "10.217.0.1"
	monitorToken = "airlock-test-monitor-token"
)

func clusterMonitorDir() string {
	if d := os.Getenv("AIRLOCK_CLUSTER_RUN"); d != "" {
		return filepath.Join(d, "monitor")
	}
	return "/run/airlock-k8s/monitor"
}

// nodeAgent is `airlock monitor-agent` as the test cluster's node runs it,
// in this process: the socket and config the monitored handlers name, the
// API on the node's address. It returns the API's port and what the agent
// saw (as the agent's own log would).
func nodeAgent(t *testing.T) (int, *sawEvents) {
	t.Helper()
	dir := clusterMonitorDir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the test cluster has no monitoring dir (%v): run scripts/cluster.sh down, then up", err)
	}
	saw := &sawEvents{}
	sock := filepath.Join(dir, "monitor.sock")
	ag, err := agent.New(sock, agent.Options{Token: monitorToken, OnEvent: saw.add, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	initConfig := filepath.Join(dir, "pod-init.json")
	if err := agent.WritePodInitConfig(initConfig, sock); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ag.Handler()}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = ag.Close()
		_ = os.Remove(initConfig)
	})
	return ln.Addr().(*net.TCPAddr).Port, saw
}

type sawEvents struct {
	mu sync.Mutex
	n  map[monitor.Kind]int
}

func (s *sawEvents) add(e monitor.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[monitor.Kind]int{}
	}
	s.n[e.Kind]++
}

// sysPy calls a raw syscall through ctypes, as the local backend's table.
const sysPy = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, os.strerror(ctypes.get_errno()))
`

// Runtime monitoring on the cluster: sandbox pods of the monitored
// RuntimeClass report to the node's agent, and each run's result names
// what its code tried: cold, warm and in a session. A benign run names
// nothing; kill_on ends the run at the attempt.
func TestMonitorOnCluster(t *testing.T) {
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	port, saw := nodeAgent(t)
	monitored := func(killOn ...string) func(*Options) {
		return func(o *Options) {
			o.RuntimeClass = "gvisor-monitor"
			o.Monitor = &MonitorOptions{Port: port, Token: monitorToken, KillOn: killOn}
		}
	}
	m := newTestManagerWith(t, cs, cfg, ns, 2, 1, monitored())
	ctx := context.Background()
	run := func(t *testing.T, code string) runtime.Result {
		t.Helper()
		res, err := m.Run(ctx, runtime.Request{Language: runtime.Python, Code: code, Limits: testLimits()})
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		return res
	}
	has := func(res runtime.Result, kind, syscall string) bool {
		for _, a := range res.Attempts {
			if a.Kind == kind && a.Syscall == syscall && a.Count > 0 {
				return true
			}
		}
		return false
	}
	for _, c := range []struct{ name, code, kind, syscall string }{
		{"mount a tmpfs", `sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)`, "mount", "mount"},
		{"unshare a user namespace", `sc("unshare", 272, 0x10000000)`, "namespace", "unshare"},
		{"setuid 0", "try:\n    os.setuid(0)\nexcept PermissionError as e:\n    print('refused', e)", "privilege", "setuid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, sysPy+c.code+"\n")
			if !has(res, c.kind, c.syscall) {
				t.Errorf("attempts %+v lack %s (%s); stdout %q stderr %q", res.Attempts, c.kind, c.syscall, res.Stdout, res.Stderr)
			}
		})
	}
	t.Run("benign", func(t *testing.T) {
		res := run(t, "import subprocess, concurrent.futures\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)\nwith concurrent.futures.ThreadPoolExecutor(4) as ex:\n    print(sum(ex.map(abs, range(-5, 5))))\nprint(open('/proc/self/status').read()[:10])")
		if res.ExitCode != 0 || len(res.Attempts) != 0 {
			t.Errorf("exit %d, attempts %+v; want 0 and none (stderr %q)", res.ExitCode, res.Attempts, res.Stderr)
		}
	})
	t.Run("warm pod", func(t *testing.T) {
		waitFor(t, 3*time.Minute, "a warm pod", func() (bool, error) {
			list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelPool + "=ready"})
			return err == nil && len(list.Items) > 0, err
		})
		res := run(t, sysPy+`sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)`+"\n")
		if !res.Warm || !has(res, "mount", "mount") {
			t.Errorf("warm %v, attempts %+v; want a warm run that names the mount", res.Warm, res.Attempts)
		}
	})
	t.Run("session", func(t *testing.T) {
		_, s := openTestSession(t, m)
		t.Cleanup(s.Close)
		res, err := runPython(s, sysPy+`sc("unshare", 272, 0x10000000)`+"\n")
		if err != nil || !has(res, "namespace", "unshare") {
			t.Fatalf("first call: err %v attempts %+v", err, res.Attempts)
		}
		// Each call names its own attempts only.
		res, err = runPython(s, "print(2)")
		if err != nil || len(res.Attempts) != 0 {
			t.Errorf("second call: err %v attempts %+v, want none", err, res.Attempts)
		}
	})
	t.Run("kill_on", func(t *testing.T) {
		mk := newTestManagerWith(t, cs, cfg, ns, 1, 0, monitored("mount"))
		code := sysPy + `sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)` + "\nimport time\ntime.sleep(60)\nprint('survived')\n"
		start := time.Now()
		res, err := mk.Run(ctx, runtime.Request{Language: runtime.Python, Code: code, Limits: testLimits()})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the run ended %v after it started", time.Since(start).Round(time.Millisecond))
		if res.Reason != runtime.ReasonPolicyViolation || strings.Contains(res.Stdout, "survived") || !has(res, "mount", "mount") {
			t.Errorf("reason %q stdout %q attempts %+v; want %s, the code stopped, the mount named", res.Reason, res.Stdout, res.Attempts, runtime.ReasonPolicyViolation)
		}
	})
	saw.mu.Lock()
	defer saw.mu.Unlock()
	if saw.n[monitor.KindMount] == 0 {
		t.Errorf("the agent saw %v, want mounts", saw.n)
	}
}

// With monitoring on and no agent on the node, no pod runs code: the run
// fails and says what to start.
func TestMonitorAgentMissing(t *testing.T) {
	cs, cfg := needCluster(t)
	ns := testNamespace(t, cs)
	m := newTestManagerWith(t, cs, cfg, ns, 1, 0, func(o *Options) {
		// The plain class (its pods start), an agent port nobody serves.
		o.Monitor = &MonitorOptions{Port: 1, Token: monitorToken}
	})
	_, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print(1)", Limits: testLimits()})
	if err == nil || !strings.Contains(err.Error(), "monitor-agent") {
		t.Errorf("err %v, want one naming the monitor agent", err)
	}
}
