package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// cgroupRoot is where the cgroups of sandboxes live (their spec's
// CgroupsPath is CgroupsPath), under every hierarchy.
const cgroupRoot = "/sys/fs/cgroup"

// CgroupsPath is the cgroup of deployment's sandbox id: one parent per
// deployment, so a sweep never looks at another deployment's.
func CgroupsPath(deployment, id string) string {
	return "/airlock/" + deployment + "/" + id
}

// RemoveStaleCgroups removes deployment's sandbox cgroups
// (cgroupRoot/*/airlock/<deployment>/airlock-*, or without the * on
// cgroup v2) whose container no longer exists, such as those of a sandbox
// whose runsc was killed before it could clean up. Only empty ones can go:
// rmdir refuses a cgroup with processes, so a live sandbox's is never
// touched. It returns how many it removed.
func RemoveStaleCgroups(ctx context.Context, client *containerd.Client, namespace, deployment string) (int, error) {
	if deployment == "" {
		return 0, errors.New("remove stale cgroups: no deployment id")
	}
	// The cgroups first, then the containers: a sandbox another instance
	// is creating has its container before its cgroup, so it is listed.
	dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "airlock", deployment, "airlock-*"))
	v2, _ := filepath.Glob(filepath.Join(cgroupRoot, "airlock", deployment, "airlock-*"))
	live, err := containerIDs(ctx, client, namespace)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, d := range append(dirs, v2...) {
		if live[filepath.Base(d)] {
			continue
		}
		if err := removeCgroup(d); err != nil {
			if !errors.Is(err, errCgroupBusy) {
				errs = append(errs, err)
			}
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// RemoveDeploymentCgroups removes deployment's parent cgroups
// (cgroupRoot/*/airlock/<deployment>, or without the * on cgroup v2) once
// they hold no sandbox's: the deployment's last instance out calls it, so
// that deployments come and go (a test's, a desktop user's) without
// leaving empty cgroups behind. One that still holds a sandbox's stays.
func RemoveDeploymentCgroups(deployment string) error {
	if deployment == "" {
		return errors.New("remove deployment cgroups: no deployment id")
	}
	v1, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "airlock", deployment))
	var errs []error
	for _, d := range append(v1, filepath.Join(cgroupRoot, "airlock", deployment)) {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// containerIDs are the ids of every container in namespace, whichever
// instance owns it.
func containerIDs(ctx context.Context, client *containerd.Client, namespace string) (map[string]bool, error) {
	cs, err := client.Containers(namespaces.WithNamespace(ctx, namespace))
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	ids := make(map[string]bool, len(cs))
	for _, c := range cs {
		ids[c.ID()] = true
	}
	return ids, nil
}

// errCgroupBusy: the cgroup still holds processes, so it is not stale.
var errCgroupBusy = errors.New("cgroup in use")

// removeCgroup removes a cgroup directory and its children, deepest first.
// The files in a cgroup directory are not files: rmdir takes them along.
func removeCgroup(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		if errors.Is(err, syscall.EBUSY) {
			return errCgroupBusy
		}
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// sandboxCgroupDirs are the directories sandbox id's cgroup may have: one
// under each named cgroup v1 hierarchy, then the cgroup v2 unified tree's.
// Only those of the host's cgroup version exist.
func sandboxCgroupDirs(deployment, id string, v1 ...string) []string {
	p := CgroupsPath(deployment, id)
	dirs := make([]string, 0, len(v1)+1)
	for _, h := range v1 {
		dirs = append(dirs, filepath.Join(cgroupRoot, h, p))
	}
	return append(dirs, filepath.Join(cgroupRoot, p))
}

// oomKills is how many processes the kernel's OOM killer has killed in
// sandbox id's memory cgroup (v1 memory.oom_control, v2 memory.events);
// ok is false where the count cannot be read. The kernel counts a kill
// before it sends the SIGKILL, so once the sandbox has seen its code die
// the count is final: unlike containerd's OOM event, it never trails.
func oomKills(deployment, id string) (n int64, ok bool) {
	for i, dir := range sandboxCgroupDirs(deployment, id, "memory") {
		name := "memory.oom_control"
		if i == 1 {
			name = "memory.events"
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		if n, ok := parseOOMKill(b); ok {
			return n, true
		}
	}
	return 0, false
}

// parseOOMKill reads the "oom_kill N" line of a memory.oom_control or
// memory.events file.
func parseOOMKill(b []byte) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, found := strings.Cut(line, " ")
		if !found || k != "oom_kill" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// setCPUShares sets the host CPU weight of sandbox id's cgroup, where the
// host has one to set (cgroup v1 cpu.shares, or v2 cpu.weight); best effort.
func setCPUShares(deployment, id string, shares int) error {
	dirs := sandboxCgroupDirs(deployment, id, "cpu,cpuacct", "cpu")
	var errs []error
	for _, dir := range dirs[:len(dirs)-1] {
		err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.Itoa(shares)), 0o644)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	// cgroup v2: weight 1..10000, default 100.
	weight := max(1, shares*100/cpuSharesNormal)
	err := os.WriteFile(filepath.Join(dirs[len(dirs)-1], "cpu.weight"), []byte(strconv.Itoa(weight)), 0o644)
	if err == nil {
		return nil
	}
	return fmt.Errorf("set cpu weight of sandbox %s: %w", id, errors.Join(append(errs, err)...))
}
