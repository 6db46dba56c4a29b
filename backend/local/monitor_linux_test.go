package local_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/runtime"
)

// syscallPy runs each of calls (name, libc syscall number, arguments as
// Python expressions) and prints what became of it; the sandbox refuses
// them all.
const syscallPy = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, os.strerror(ctypes.get_errno()) if r < 0 else "")
`

// Hostile programs: each is refused by the sandbox, and gVisor's runtime
// monitoring names what it tried in the result.
func TestMonitorNamesAttempts(t *testing.T) {
	need(t)
	cases := []struct {
		name, code, kind, syscall string
	}{
		{"mount a tmpfs", `sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)`, "mount", "mount"},
		{"pivot_root", `sc("pivot_root", 155, b"/tmp", b"/tmp")`, "mount", "pivot_root"},
		{"unshare a user namespace", `sc("unshare", 272, 0x10000000)`, "namespace", "unshare"},
		{"setns", `sc("setns", 308, 0, 0)`, "namespace", "setns"},
		{"finit_module", `sc("finit_module", 313, -1, b"", 0)`, "module", "finit_module"},
		{"kexec_load", `sc("kexec_load", 246, 0, 0, 0, 0)`, "module", "kexec_load"},
		{"bpf", `sc("bpf", 321, 0, 0, 0)`, "kernel", "bpf"},
		{"keyctl", `sc("keyctl", 250, 0, 0, 0, 0, 0)`, "kernel", "keyctl"},
		{"perf_event_open", `sc("perf_event_open", 298, 0, 0, -1, -1, 0)`, "kernel", "perf_event_open"},
		{"ptrace TRACEME", `print(libc.ptrace(0, 0, 0, 0))`, "ptrace", "ptrace"},
		{"setuid 0", `
try:
    os.setuid(0)
except PermissionError as e:
    print("refused", e)`, "privilege", "setuid"},
		{"write under /usr", `
try:
    open("/usr/airlock-was-here", "w")
except OSError as e:
    print("refused", e)`, "readonly_write", "openat"},
		// With no network stack (network "none") the connect fails inside
		// gVisor: no packet exists, let alone leaves; 192.0.2.1 is
		// TEST-NET-1 besides.
		{"connect past the sandbox", `
import socket
try:
    socket.create_connection(("192.0.2.1", 9), timeout=2)
except OSError as e:
    print("refused", e)`, "connect_blocked", "connect"},
		{"raw socket", `
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
except OSError as e:
    print("refused", e)`, "raw_socket", "socket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, runtime.Python, syscallPy+strings.TrimSpace(c.code)+"\n")
			found := false
			for _, a := range res.Attempts {
				if a.Kind == c.kind && a.Syscall == c.syscall && a.Count >= 1 {
					found = true
				}
			}
			if !found {
				t.Errorf("attempts %+v lack %s (%s); stdout %q stderr %q", res.Attempts, c.kind, c.syscall, res.Stdout, res.Stderr)
			}
		})
	}
}

// What ordinary programs do gives no attempts: imports of the big
// libraries, a subprocess, a thread pool, reading /proc/self, writing the
// workspace.
func TestMonitorQuietForOrdinaryPrograms(t *testing.T) {
	need(t)
	cases := []struct {
		name string
		lang runtime.Language
		code string
	}{
		{"numpy and pandas", runtime.Python, "import numpy, pandas\nprint(pandas.DataFrame({'a': numpy.arange(3)}).sum())"},
		{"matplotlib figure", runtime.Python, "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('/tmp/f.png')"},
		{"subprocess", runtime.Python, "import subprocess\nprint(subprocess.run(['ls', '/'], capture_output=True).returncode)"},
		{"thread pool", runtime.Python, "from concurrent.futures import ThreadPoolExecutor\nprint(sum(ThreadPoolExecutor(4).map(lambda x: x * x, range(100))))"},
		{"/proc/self", runtime.Shell, "cat /proc/self/status /proc/self/maps > /dev/null; ls /proc/self/fd"},
		{"workspace files", runtime.Shell, "echo hi > a.txt; mkdir -p d/e; cp a.txt d/e/; cat d/e/a.txt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, c.lang, c.code)
			if res.ExitCode != 0 {
				t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
			}
			if len(res.Attempts) != 0 {
				t.Errorf("an ordinary program gave attempts %s", fmt.Sprint(res.Attempts))
			}
		})
	}
}

// With monitor.kill_on naming a kind, the run ends at its first attempt
// with reason policy_violation: the code after it never runs (it would
// otherwise sleep past the run's timeout, which names another reason).
func TestMonitorKillOn(t *testing.T) {
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	o := managerOptions(t, s, slog.LevelWarn)
	o.KillOn = []string{"mount"}
	m := startManager(t, s, ctx, o)
	code := syscallPy + "sc(\"mount\", 165, b\"none\", b\"/tmp\", b\"tmpfs\", 0, None)\nimport time\ntime.sleep(60)\nprint(\"survived\")\n"
	res, err := m.Run(ctx, runtime.Request{Language: runtime.Python, Code: code, Limits: limits()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != runtime.ReasonPolicyViolation || strings.Contains(res.Stdout, "survived") {
		t.Errorf("reason %q, stdout %q; want %s and the code stopped", res.Reason, res.Stdout, runtime.ReasonPolicyViolation)
	}
	if len(res.Attempts) == 0 || res.Attempts[0].Kind != "mount" {
		t.Errorf("attempts %+v, want the mount", res.Attempts)
	}
}
