package local_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// What a run's code sees of its Env and HomeFiles, as one line: the
// variable, in the code's process and in a child's, and the home file's
// content, mode and whether the code's user owns it.
const (
	overlayPython = `import os, subprocess
st = os.stat("/workspace/.netrc")
child = subprocess.check_output(["/bin/bash", "-c", "echo $AIRLOCK_TEST_X"], text=True).strip()
print(os.environ.get("AIRLOCK_TEST_X"), child, open("/workspace/.netrc").read(), format(st.st_mode & 0o7777, "o"), st.st_uid == os.getuid(), sep="|")
`
	overlayShell = `owner=False; [ "$(stat -c %u /workspace/.netrc)" = "$(id -u)" ] && owner=True
echo "$AIRLOCK_TEST_X|$(bash -c 'echo $AIRLOCK_TEST_X')|$(cat /workspace/.netrc)|$(stat -c %a /workspace/.netrc)|$owner"
`
	overlayWant = "v1|v1|machine x|600|True\n"
)

var (
	overlayEnv  = map[string]string{"AIRLOCK_TEST_X": "v1"}
	overlayHome = map[string]string{".netrc": "machine x"}
)

func overlayRun(t *testing.T, m runtime.Manager, lim runtime.Limits, lang runtime.Language, code string) runtime.Result {
	t.Helper()
	r, err := m.Run(context.Background(), runtime.Request{Language: lang, Code: code, Limits: lim, Env: overlayEnv, HomeFiles: overlayHome})
	if err != nil {
		t.Fatalf("Run %s: %v", lang, err)
	}
	return r
}

// A run's Env and HomeFiles reach its code in a pooled sandbox, booted
// before the run was known, as in a cold one: Python (the warm worker's
// os.environ, and its children's) and shell.
func TestRunEnvAndHomeFiles(t *testing.T) {
	s := need(t)
	t.Run("cold", func(t *testing.T) {
		for _, c := range []struct {
			lang runtime.Language
			code string
		}{{runtime.Python, overlayPython}, {runtime.Shell, overlayShell}} {
			r := overlayRun(t, s.Manager, limits(), c.lang, c.code)
			if r.Warm || r.ExitCode != 0 || r.Stdout != overlayWant {
				t.Errorf("%s: warm %v exit %d stdout %q stderr %q; want cold and %q", c.lang, r.Warm, r.ExitCode, r.Stdout, r.Stderr, overlayWant)
			}
		}
	})
	t.Run("pooled", func(t *testing.T) { overlayPooled(t, s, false) })
	// pool.restore's default: the worker was restored from a checkpoint
	// made before any run.
	t.Run("pooled restored", func(t *testing.T) { overlayPooled(t, s, true) })
	t.Run("refused before a sandbox", func(t *testing.T) {
		for _, req := range []runtime.Request{
			{Language: runtime.Shell, Code: "true", Limits: limits(), Env: map[string]string{"HOME": "/tmp"}},
			{Language: runtime.Shell, Code: "true", Limits: limits(), Env: map[string]string{"A=B": "v"}},
			{Language: runtime.Shell, Code: "true", Limits: limits(), HomeFiles: map[string]string{"../x": ""}},
		} {
			_, err := s.Manager.Run(context.Background(), req)
			var ie *runtime.InfraError
			if err == nil || errors.As(err, &ie) || !(errors.Is(err, driver.ErrBadEnv) || errors.Is(err, driver.ErrBadHomeFile)) {
				t.Errorf("Env %v HomeFiles %v: %v, want a refusal of the request", req.Env, req.HomeFiles, err)
			}
		}
	})
}

// A session's Env and HomeFiles are every call's, with a call's own Env
// over them.
func TestSessionEnvAndHomeFiles(t *testing.T) {
	s := need(t)
	var sm runtime.SessionManager = s.Manager
	sess, err := sm.OpenSession(context.Background(), runtime.SessionOptions{ID: "stest" + runtime.NewRunID(), Limits: limits(), Env: overlayEnv, HomeFiles: overlayHome})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() {
		sess.Close()
		assertNoSandboxes(t, s)
	})
	for i, c := range []struct {
		lang runtime.Language
		code string
	}{{runtime.Python, overlayPython}, {runtime.Shell, overlayShell}, {runtime.Python, overlayPython}} {
		r := cell(t, sess, c.lang, c.code, 0)
		if r.ExitCode != 0 || r.Stdout != overlayWant {
			t.Errorf("call %d (%s): exit %d stdout %q stderr %q; want %q", i, c.lang, r.ExitCode, r.Stdout, r.Stderr, overlayWant)
		}
	}
	// A call's own variable, and one that replaces the session's.
	r, err := sess.Run(context.Background(), runtime.Request{Language: runtime.Shell, Code: `echo "$AIRLOCK_TEST_X $AIRLOCK_TEST_Y"`, Limits: limits(),
		Env: map[string]string{"AIRLOCK_TEST_X": "v2", "AIRLOCK_TEST_Y": "y"}})
	if err != nil || r.ExitCode != 0 || r.Stdout != "v2 y\n" {
		t.Errorf("call with its own Env: %v, exit %d stdout %q stderr %q; want %q", err, r.ExitCode, r.Stdout, r.Stderr, "v2 y\n")
	}
}

// overlayPooled runs overlayPython and overlayShell in sandboxes of a pool
// of one, booted or restored.
func overlayPooled(t *testing.T, s *boot.Stack, restore bool) {
	m := poolManager(t, 1, 2, restore)
	if restore {
		// The first pooled sandbox boots while the template is made; the
		// next is restored.
		if !local.WaitTemplate(m, 3*time.Minute) {
			t.Fatal("no template")
		}
		poolRun(t, m, runtime.Shell, "true")
	}
	for _, c := range []struct {
		lang runtime.Language
		code string
	}{{runtime.Python, overlayPython}, {runtime.Shell, overlayShell}} {
		waitReady(t, m, 1)
		// The pool's limits, as a pooled sandbox serves only those.
		r := overlayRun(t, m, s.Config.Limits.RunLimits(0), c.lang, c.code)
		if !r.Warm || r.ExitCode != 0 || r.Stdout != overlayWant {
			t.Errorf("%s: warm %v exit %d stdout %q stderr %q; want warm and %q", c.lang, r.Warm, r.ExitCode, r.Stdout, r.Stderr, overlayWant)
		}
	}
	if restore && local.Restored(m) == 0 {
		t.Error("the pool refilled by booting")
	}
}
