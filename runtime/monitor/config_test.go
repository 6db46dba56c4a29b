package monitor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Named syscall points registered by gVisor at the pinned version
// (gvisor.dev/gvisor@v0.0.0-20260905035102-160fafc42237), copied from the
// addSyscallPoint calls in pkg/sentry/seccheck/metadata_amd64.go and
// metadata_arm64.go. Each registers "syscall/<name>/enter" and ".../exit".
var (
	gvisorNamedAMD64 = []string{"read", "write", "open", "close", "mmap", "pread64", "pwrite64", "readv", "writev", "pipe", "dup", "dup2", "socket", "connect", "accept", "bind", "listen", "socketpair", "clone", "fork", "vfork", "execve", "fcntl", "creat", "chdir", "fchdir", "ptrace", "setuid", "setgid", "setsid", "setresuid", "setresgid", "chroot", "inotify_init", "inotify_add_watch", "inotify_rm_watch", "openat", "signalfd", "timerfd_create", "eventfd", "timerfd_settime", "timerfd_gettime", "accept4", "signalfd4", "eventfd2", "dup3", "pipe2", "inotify_init1", "preadv", "pwritev", "prlimit64", "execveat", "preadv2", "pwritev2"}
	gvisorNamedARM64 = []string{"eventfd2", "dup", "dup3", "fcntl", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "chdir", "fchdir", "chroot", "openat", "close", "pipe2", "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "signalfd4", "timerfd_create", "timerfd_settime", "timerfd_gettime", "ptrace", "setgid", "setuid", "setresuid", "setresgid", "setsid", "socket", "socketpair", "bind", "listen", "accept", "connect", "clone", "execve", "mmap", "accept4", "prlimit64", "execveat", "preadv2", "pwritev2"}
	// pkg/sentry/seccheck/metadata.go, genericInit.
	gvisorGeneric = []string{"container/start", "sentry/clone", "sentry/execve", "sentry/exit_notify_parent", "sentry/task_exit", "sentry/mmap"}
	// pkg/sentry/seccheck/metadata.go, defaultContextFields.
	gvisorContextFields = []string{"time", "thread_id", "task_start_time", "group_id", "thread_group_start_time", "container_id", "credentials", "cwd", "process_name", "parent_thread_group_id", "is_exec_session"}
)

// gvisorPoints rebuilds the set of point names gVisor registers: the generic
// points, the named syscall points, and "syscall/sysno/N/enter|exit" for N
// in 0..441 (lastSyscallInTable on both architectures).
func gvisorPoints(named []string) map[string]bool {
	pts := map[string]bool{}
	for _, n := range gvisorGeneric {
		pts[n] = true
	}
	for _, n := range named {
		pts["syscall/"+n+"/enter"] = true
		pts["syscall/"+n+"/exit"] = true
	}
	for i := 0; i <= 441; i++ {
		pts[fmt.Sprintf("syscall/sysno/%d/enter", i)] = true
		pts[fmt.Sprintf("syscall/sysno/%d/exit", i)] = true
	}
	return pts
}

func TestPointNamesExistInGVisor(t *testing.T) {
	for arch, named := range map[string][]string{"amd64": gvisorNamedAMD64, "arm64": gvisorNamedARM64} {
		known := gvisorPoints(named)
		names := archTables[arch].pointNames()
		if len(names) == 0 {
			t.Fatalf("%s: no points", arch)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("%s: point %q is not registered by gVisor: sandbox creation would fail", arch, n)
			}
		}
		if len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Errorf("%s: duplicate point names", arch)
		}
	}
	for _, f := range contextFields {
		if !slices.Contains(gvisorContextFields, f) {
			t.Errorf("context field %q is not one gVisor knows", f)
		}
	}
}

func TestArchTablesAgree(t *testing.T) {
	// Every architecture watches the same syscalls by name.
	names := func(a *archTable) []string {
		var s []string
		for _, r := range a.raw {
			s = append(s, r.name+"/"+string(r.kind))
		}
		slices.Sort(s)
		return s
	}
	if a, b := names(archTables["amd64"]), names(archTables["arm64"]); !slices.Equal(a, b) {
		t.Fatalf("amd64 %v\narm64 %v", a, b)
	}
}

func TestConfigJSON(t *testing.T) {
	if hostArch == nil {
		t.Skip("no syscall table for this architecture")
	}
	out, err := Config("/run/airlock/monitor.sock")
	if err != nil {
		t.Fatal(err)
	}
	// Decode strictly into the shape runsc's boot.InitConfig /
	// seccheck.SessionConfig accepts (runsc uses DisallowUnknownFields).
	var cfg struct {
		TraceSession struct {
			Name          string `json:"name"`
			IgnoreMissing bool   `json:"ignore_missing"`
			Points        []struct {
				Name           string   `json:"name"`
				OptionalFields []string `json:"optional_fields"`
				ContextFields  []string `json:"context_fields"`
			} `json:"points"`
			Sinks []struct {
				Name             string         `json:"name"`
				Config           map[string]any `json:"config"`
				IgnoreSetupError *bool          `json:"ignore_setup_error"`
			} `json:"sinks"`
		} `json:"trace_session"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := cfg.TraceSession
	if s.Name != "Default" || s.IgnoreMissing {
		t.Errorf("session name %q, ignore_missing %v", s.Name, s.IgnoreMissing)
	}
	if len(s.Sinks) != 1 || s.Sinks[0].Name != "remote" || s.Sinks[0].Config["endpoint"] != "/run/airlock/monitor.sock" ||
		s.Sinks[0].IgnoreSetupError == nil || *s.Sinks[0].IgnoreSetupError {
		t.Errorf("sinks: %+v", s.Sinks)
	}
	want, _ := PointNames()
	var got []string
	for _, p := range s.Points {
		got = append(got, p.Name)
		if !slices.Equal(p.ContextFields, []string{"container_id"}) {
			t.Errorf("point %s context fields %v", p.Name, p.ContextFields)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("points %v, want %v", got, want)
	}
	for _, n := range []string{"syscall/sysno/165/enter", "syscall/ptrace/enter", "syscall/openat/exit", "syscall/connect/exit"} {
		if hostArch == archTables["amd64"] && !slices.Contains(got, n) {
			t.Errorf("missing %s", n)
		}
	}
	if _, err := Config(""); err == nil || !strings.Contains(err.Error(), "endpoint") {
		t.Errorf("empty endpoint: %v", err)
	}
}
