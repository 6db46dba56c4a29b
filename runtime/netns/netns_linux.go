// Package netns creates, enters and removes named network namespaces: the
// host backend's sandbox namespaces, and the test-owned ones its tests and
// the Kubernetes backend's tests route stand-in hosts into.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureDir makes dir a shared mount point, as `ip netns add` does, so
// namespace bind mounts made later propagate to (and can be unmounted from)
// other mount namespaces.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	// Not a mount point yet: bind it onto itself, then share it.
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// Create creates the named network namespace dir/name, brings its loopback
// up and turns IPv6 off in it, and returns its path. The new namespace is
// made on a locked OS thread that is never returned to the Go scheduler
// (the goroutine exits still locked, so the runtime discards the thread).
func Create(dir, name string) (string, error) {
	if err := ensureDir(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("create netns file: %w", err)
	}
	_ = f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: this thread ends up in the new namespace.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount netns: %w", err)
			return
		}
		errc <- setupHere()
	}()
	if err := <-errc; err != nil {
		_ = Delete(path)
		return "", err
	}
	return path, nil
}

// setupHere runs on a thread inside the new namespace.
func setupHere() error {
	// /proc/sys/net shows the namespace of the thread that opens it.
	for _, k := range []string{"all", "default", "lo"} {
		if err := WriteSysctl("net/ipv6/conf/"+k+"/disable_ipv6", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netns loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("netns loopback up: %w", err)
	}
	return nil
}

// WriteSysctl sets /proc/sys/key, in the network namespace of the calling
// thread for keys under net/.
func WriteSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// Delete unmounts and removes a named namespace; absent is fine.
func Delete(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// Do runs fn on an OS thread that has joined the namespace at path ("" for
// the caller's own, on the calling goroutine). Sockets fn creates belong to
// that namespace and stay usable from any goroutine afterwards. The thread
// is discarded when fn returns.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread must not go back to the scheduler.
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		_ = unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
