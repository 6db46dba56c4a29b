package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/backend/local/boot"
)

// Memory is what idle pooled sandboxes cost the host.
type Memory struct {
	// Preload are the modules the warm sandboxes had imported.
	Preload []string `json:"preload"`
	Idle    int      `json:"idle_sandboxes"`
	// PerSandboxPSS is the proportional set size of all their host
	// processes (shims, sentries with their stubs, gofers) divided by Idle,
	// in MiB: shared pages count once across them.
	PerSandboxPSS float64 `json:"per_sandbox_pss_mib"`
	PerSandboxRSS float64 `json:"per_sandbox_rss_mib"`
	// By process kind (shim, sentry, gofer), per sandbox, PSS MiB.
	ByKind map[string]float64 `json:"by_kind_pss_mib"`
	// Processes is how many host processes the sandboxes took.
	Processes int `json:"processes"`
}

// measureIdle starts a pool of n warm sandboxes whose worker imported
// preload, and measures them.
func measureIdle(ctx context.Context, s *boot.Stack, n int, preload []string) (Memory, error) {
	m, _, err := newManager(ctx, s, n, 1, preload, variant{})
	if err != nil {
		return Memory{}, err
	}
	defer m.Close(context.WithoutCancel(ctx))
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if ready, _ := m.Pool().Ready(); ready >= n {
			break
		}
		if time.Now().After(deadline) {
			return Memory{}, fmt.Errorf("pool of %d did not fill in 5 minutes", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let the last one settle
	ids, err := idleIDs(ctx, s, s.Instance.ID)
	if err != nil {
		return Memory{}, err
	}
	mem, err := measureProcesses(ids)
	mem.Preload = preload
	return mem, err
}

// idleIDs are the container ids of an instance's idle pooled sandboxes.
func idleIDs(ctx context.Context, s *boot.Stack, instance string) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, s.Config.Containerd.Namespace)
	cs, err := s.Client.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==idle`, local.LabelInstance, instance, local.LabelPool))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID())
	}
	return ids, nil
}

// takenIDs are the container ids of an instance's sandboxes that are not
// waiting in its pool: serving a run, or being torn down.
func takenIDs(ctx context.Context, s *boot.Stack, instance string) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, s.Config.Containerd.Namespace)
	cs, err := s.Client.Containers(ctx, fmt.Sprintf(`labels."%s"==%s`, local.LabelInstance, instance))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			continue
		}
		if p := labels[local.LabelPool]; p != "idle" && p != "warming" {
			ids = append(ids, c.ID())
		}
	}
	return ids, nil
}

type proc struct {
	pid, ppid int
	args      string
}

// measureProcesses finds the host processes of the sandboxes ids (their
// runsc sentry and gofer, the sentry's descendants, and the shims they
// hang from) and sums their memory.
func measureProcesses(ids []string) (Memory, error) {
	procs, err := listProcs()
	if err != nil {
		return Memory{}, err
	}
	children := map[int][]int{}
	byPid := map[int]proc{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		byPid[p.pid] = p
	}
	kinds := map[int]string{}
	var add func(pid int, kind string)
	add = func(pid int, kind string) {
		if _, seen := kinds[pid]; seen {
			return
		}
		kinds[pid] = kind
		for _, c := range children[pid] {
			add(c, kind) // systrap stubs count with their sentry
		}
	}
	for _, p := range procs {
		for _, id := range ids {
			if !strings.Contains(p.args, "/"+id+"/") && !strings.HasSuffix(p.args, " "+id) {
				continue
			}
			switch {
			case strings.HasPrefix(p.args, "runsc-sandbox"):
				add(p.pid, "sentry")
			case strings.HasPrefix(p.args, "runsc-gofer"):
				add(p.pid, "gofer")
			default:
				continue
			}
			if parent, ok := byPid[p.ppid]; ok && strings.Contains(parent.args, "containerd-shim") {
				kinds[parent.pid] = "shim"
			}
		}
	}
	mem := Memory{Idle: len(ids), ByKind: map[string]float64{}, Processes: len(kinds)}
	if len(ids) == 0 {
		return mem, fmt.Errorf("no idle sandboxes found")
	}
	for pid, kind := range kinds {
		pss, rss, err := rollup(pid)
		if err != nil {
			continue // exited meanwhile
		}
		mem.PerSandboxPSS += pss
		mem.PerSandboxRSS += rss
		mem.ByKind[kind] += pss
	}
	n := float64(len(ids))
	mem.PerSandboxPSS /= n
	mem.PerSandboxRSS /= n
	for k := range mem.ByKind {
		mem.ByKind[k] /= n
	}
	return mem, nil
}

func listProcs() ([]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The field after the ")" that ends the command name is the state,
		// then the parent pid.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, proc{pid: pid, ppid: ppid, args: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))})
	}
	return out, nil
}

// rollup returns a process's PSS and RSS in MiB.
func rollup(pid int) (pss, rss float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "Pss:":
			pss = kb / 1024
		case "Rss:":
			rss = kb / 1024
		}
	}
	return pss, rss, sc.Err()
}
