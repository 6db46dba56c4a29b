package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
