package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/backend/local/daemon"
)

// RemoveOrphanSandboxProcesses kills the gVisor processes (runsc's sandbox
// and gofer) of deployment's sandboxes in namespace whose container
// containerd no longer knows. They outlive their task when the airlock that
// was creating it is killed at the wrong moment. Only processes under the
// deployment's runsc root are considered (another deployment's sandboxes,
// in another daemon, are not in this one's container list), and a
// container that exists, whichever instance owns it, is never touched. It
// returns how many processes it killed.
func RemoveOrphanSandboxProcesses(ctx context.Context, client *containerd.Client, namespace, deployment string) (int, error) {
	if deployment == "" {
		return 0, errors.New("remove orphan sandbox processes: no deployment id")
	}
	root := filepath.Join(RunscRoot(deployment), namespace)
	// The processes first, then the containers: a sandbox another instance
	// is creating has its container before its runsc, so it is listed.
	type candidate struct {
		pid int
		id  string
	}
	var found []candidate
	for _, p := range runscProcesses() {
		ns, id, ok := runscBundle(p.args)
		if !ok || ns != namespace || !strings.HasPrefix(id, "airlock-") || runscFlag(p.args, "root") != root {
			continue
		}
		found = append(found, candidate{p.pid, id})
	}
	if len(found) == 0 {
		return 0, nil
	}
	live, err := containerIDs(ctx, client, namespace)
	if err != nil {
		return 0, err
	}
	var killed []int
	var errs []error
	for _, c := range found {
		if live[c.id] {
			continue
		}
		if err := syscall.Kill(c.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill orphaned runsc %d (%s): %w", c.pid, c.id, err))
			continue
		}
		killed = append(killed, c.pid)
	}
	// Their cgroups can go once they are gone.
	waiting := append([]int(nil), killed...)
	for end := time.Now().Add(5 * time.Second); len(waiting) > 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		still := waiting[:0]
		for _, pid := range waiting {
			if daemon.ProcessAlive(pid) {
				still = append(still, pid)
			}
		}
		waiting = still
	}
	return len(killed), errors.Join(errs...)
}

// runscProc is a running runsc process (gVisor names them runsc-sandbox,
// runsc-gofer, or runsc) and its arguments.
type runscProc struct {
	pid  int
	args []string
}

// runscProcesses lists the runsc processes on this host, of every
// deployment: callers pick theirs by the --root and --bundle flags.
func runscProcesses() []runscProc { return processesOf("runsc") }

// processesOf lists the processes whose executable's name starts with
// prefix, with their arguments.
func processesOf(prefix string) []runscProc {
	var out []runscProc
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), prefix) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		out = append(out, runscProc{pid, args})
	}
	return out
}

// runscFlag returns the last value of runsc's flag name in args ("" when
// absent): runsc, like the flag package, lets a later one win.
func runscFlag(args []string, name string) string {
	v := ""
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--"+name+"="):
			v = strings.TrimPrefix(a, "--"+name+"=")
		case strings.HasPrefix(a, "-"+name+"="):
			v = strings.TrimPrefix(a, "-"+name+"=")
		case (a == "--"+name || a == "-"+name) && i+1 < len(args):
			v = args[i+1]
		}
	}
	return filepath.Clean(v)
}

// runscBundle finds, in the arguments of a runsc process (gVisor names
// them runsc-sandbox, runsc-gofer, or runsc), its bundle directory, which
// containerd names .../<namespace>/<container id>.
func runscBundle(args []string) (namespace, id string, ok bool) {
	if len(args) < 2 || !strings.HasPrefix(filepath.Base(args[0]), "runsc") {
		return "", "", false
	}
	for i, a := range args {
		var bundle string
		switch {
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		case a == "--bundle" && i+1 < len(args):
			bundle = args[i+1]
		default:
			continue
		}
		bundle = filepath.Clean(bundle)
		return filepath.Base(filepath.Dir(bundle)), filepath.Base(bundle), bundle != "."
	}
	return "", "", false
}

// RemoveRunscRoot removes deployment's runsc state root, where runsc
// leaves a bind mount of an empty network namespace (null-netns) and the
// lock files of sandboxes it has deleted. Only the deployment's last
// instance out calls it, and it removes nothing while containerd still
// lists a container of the deployment in namespace or a runsc process
// still uses the root: deleting a container whose runsc state is gone
// would hang its shim. It reports whether it removed the root.
func RemoveRunscRoot(ctx context.Context, client *containerd.Client, namespace, deployment string) (bool, error) {
	if deployment == "" {
		return false, errors.New("remove runsc root: no deployment id")
	}
	root := RunscRoot(deployment)
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	ids, err := client.ContainerService().List(namespaces.WithNamespace(ctx, namespace), fmt.Sprintf("labels.%q==%s", LabelDeployment, deployment))
	if err != nil {
		return false, fmt.Errorf("list sandboxes: %w", err)
	}
	if len(ids) > 0 {
		return false, nil
	}
	for _, p := range runscProcesses() {
		if r := runscFlag(p.args, "root"); r == root || strings.HasPrefix(r, root+"/") {
			return false, nil
		}
	}
	mounts, _ := filepath.Glob(filepath.Join(root, "*", "null-netns"))
	for _, m := range mounts {
		// runsc may have mounted it more than once: unmount until none is left.
		for range 16 {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
					break
				}
				return false, fmt.Errorf("unmount %s: %w", m, err)
			}
		}
	}
	if err := os.RemoveAll(root); err != nil {
		return false, fmt.Errorf("remove runsc root: %w", err)
	}
	return true, nil
}

// RemoveOrphanTasks ends the shims of namespace's sandbox tasks whose
// container is gone, and returns how many it ended. An airlock killed while
// it made a sandbox (a restore, most often) can leave a task whose creation
// finished after a sweep removed its container: no state of airlock's has a
// task without its container, a container-based sweep never sees it, and
// containerd's task API needs the container to delete it. Killing its shim
// makes containerd clean it up: the shim's delete removes runsc's state and
// the rootfs mount. Such a task is nobody's, whichever deployment made it.
func RemoveOrphanTasks(ctx context.Context, client *containerd.Client, namespace string) (int, error) {
	ctx = namespaces.WithNamespace(ctx, namespace)
	resp, err := client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return 0, fmt.Errorf("list tasks: %w", err)
	}
	// Containers after tasks: a container exists before its task, so one
	// listed as a task and not as a container is an orphan.
	cs, err := client.ContainerService().List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	have := map[string]bool{}
	for _, c := range cs {
		have[c.ID] = true
	}
	n := 0
	for _, t := range resp.Tasks {
		if !strings.HasPrefix(t.ID, "airlock-") || have[t.ID] {
			continue
		}
		for _, pid := range shimPIDs(namespace, t.ID) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				n++
			}
		}
	}
	return n, nil
}

// shimPIDs are the pids of the containerd shims serving task id in
// namespace.
func shimPIDs(namespace, id string) []int {
	var out []int
	for _, p := range processesOf("containerd-shim") {
		if shimArg(p.args, "namespace") == namespace && shimArg(p.args, "id") == id {
			out = append(out, p.pid)
		}
	}
	return out
}

// shimArg is the value of a shim's flag name ("-name value").
func shimArg(args []string, name string) string {
	for i, a := range args {
		if (a == "-"+name || a == "--"+name) && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
