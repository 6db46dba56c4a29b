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

// memoryCounts are two counters of a sandbox's memory cgroup.
type memoryCounts struct {
	// Kills is how many processes the kernel's OOM killer has killed
	// there (v1 memory.oom_control oom_kill, v2 memory.events oom_kill).
	Kills int64
	// LimitHits is how many times a charge met the memory limit (v1
	// memory.failcnt, v2 memory.events max), whether or not a kill
	// followed: an allocation that failed with ENOMEM moves it too.
	LimitHits int64
}

// memoryCounters reads sandbox id's memoryCounts; ok is false where the
// kill count cannot be read. The kernel counts a kill before it sends the
// SIGKILL, so once the sandbox has seen its code die the counts are final:
// unlike containerd's OOM event, they never trail.
func memoryCounters(deployment, id string) (c memoryCounts, ok bool) {
	dirs := sandboxCgroupDirs(deployment, id, "memory")
	// cgroup v1: the kills in oom_control, the limit hits in failcnt.
	if b, err := os.ReadFile(filepath.Join(dirs[0], "memory.oom_control")); err == nil {
		if c.Kills, ok = parseCounter(b, "oom_kill"); ok {
			if b, err := os.ReadFile(filepath.Join(dirs[0], "memory.failcnt")); err == nil {
				c.LimitHits, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			}
			return c, true
		}
	}
	// cgroup v2: both in memory.events.
	if b, err := os.ReadFile(filepath.Join(dirs[1], "memory.events")); err == nil {
		if c.Kills, ok = parseCounter(b, "oom_kill"); ok {
			c.LimitHits, _ = parseCounter(b, "max")
			return c, true
		}
	}
	return memoryCounts{}, false
}

// ranOutOfMemory reports whether a run whose code ended with exit code
// exit ran out of memory, given the sandbox's memory counts when the run
// began and ended. A kill by the OOM killer decides; so does code that
// failed after meeting the limit, since an allocation refused there
// surfaces as the code's own error (Python's MemoryError, exit 1) rather
// than as a kill. Code that exits 0 did not run out of memory, whatever
// it met on the way.
func ranOutOfMemory(exit int, before, after memoryCounts) bool {
	if exit == 0 {
		return false
	}
	return after.Kills > before.Kills || after.LimitHits > before.LimitHits
}

// parseCounter reads the "key N" line of a cgroup file such as
// memory.oom_control or memory.events.
func parseCounter(b []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, found := strings.Cut(line, " ")
		if !found || k != key {
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
