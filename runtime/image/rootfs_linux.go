package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// buildRootfs returns dir/rootfs-<hash>, running debootstrap into a .tmp
// sibling first so that a half-made tree is never mistaken for a finished one.
func buildRootfs(ctx context.Context, dir string, r Recipe, log *slog.Logger) (string, error) {
	final := filepath.Join(dir, "rootfs-"+r.Hash())
	if fi, err := os.Stat(final); err == nil && fi.IsDir() {
		log.Info("reusing rootfs", "dir", final)
		return final, nil
	}
	tmp := final + ".tmp"
	// A .tmp left by a crashed build is unusable: start over.
	if err := removeTree(tmp); err != nil {
		return "", fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	ok := false
	defer func() {
		if !ok {
			if err := removeTree(tmp); err != nil {
				log.Warn("cleanup of failed rootfs", "dir", tmp, "err", err)
			}
		}
	}()

	start := time.Now()
	log.Info("debootstrap", "suite", r.Suite, "mirror", r.Mirror, "dir", tmp)
	if err := debootstrap(ctx, tmp, r, log); err != nil {
		return "", fmt.Errorf("build rootfs: %w", err)
	}
	log.Info("debootstrap done", "took", time.Since(start).Round(time.Second))
	// Nothing may stay mounted in a tree about to be archived.
	if err := unmountUnder(tmp); err != nil {
		return "", err
	}
	if err := customize(tmp, r); err != nil {
		return "", fmt.Errorf("customize rootfs: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("rename rootfs: %w", err)
	}
	ok = true
	return final, nil
}

// debootstrap makes a minbase tree, then installs the recipe's packages
// with apt inside it. debootstrap's own --include resolver always takes the
// first alternative of a dependency, so python3-fonttools' "python3-scipy |
// python3-munkres" drags in scipy, pythran, g++ and boost headers (1.3 GiB
// instead of ~500 MiB); apt honours alternatives named on its command line.
func debootstrap(ctx context.Context, target string, r Recipe, log *slog.Logger) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("debootstrap not installed (apt-get install debootstrap): %w", err)
	}
	err := run(ctx, log, "debootstrap", "--variant=minbase", r.Suite, target, r.Mirror)
	if err != nil {
		if tail := readTail(filepath.Join(target, "debootstrap", "debootstrap.log"), 20); tail != "" {
			err = fmt.Errorf("%w\n--- debootstrap.log ---\n%s", err, tail)
		}
		return err
	}
	if len(r.Packages) == 0 {
		return nil
	}
	if err := aptInstall(ctx, target, r.Packages, log); err != nil {
		return fmt.Errorf("apt-get install: %w", err)
	}
	return nil
}

// aptInstall runs apt-get in a chroot of root with /proc mounted (dpkg
// maintainer scripts want it) and services barred from starting.
func aptInstall(ctx context.Context, root string, pkgs []string, log *slog.Logger) (err error) {
	proc := filepath.Join(root, "proc")
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	defer func() {
		if uerr := unix.Unmount(proc, unix.MNT_DETACH); uerr != nil && err == nil {
			err = fmt.Errorf("unmount proc: %w", uerr)
		}
	}()
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	defer os.Remove(policy)

	apt := []string{root, "apt-get", "-q", "-y", "-o", "Dpkg::Options::=--force-unsafe-io", "-o", "APT::Install-Recommends=false"}
	if err := run(ctx, log, "chroot", append(apt, "update")...); err != nil {
		return err
	}
	return run(ctx, log, "chroot", append(append(apt, "install"), pkgs...)...)
}

// run runs a build command, logging its output at debug level and keeping
// the tail for the error message.
func run(ctx context.Context, log *slog.Logger, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	// On cancel, TERM the whole group: debootstrap's exit trap unmounts the
	// target's proc and sys, which a KILL of debootstrap alone would skip,
	// and dpkg children would outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"DEBIAN_FRONTEND=noninteractive",
		"LC_ALL=C",
		"HOME=/root",
	}
	// A host that reaches its mirror through a proxy needs it here too.
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	tail := &tailBuffer{max: 40}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			tail.add(sc.Text())
			log.Debug(name, "line", sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, tail)
	}
	return nil
}

type tailBuffer struct {
	max   int
	lines []string
}

func (t *tailBuffer) add(s string) {
	t.lines = append(t.lines, s)
	if len(t.lines) > t.max {
		t.lines = t.lines[1:]
	}
}

func (t *tailBuffer) String() string { return strings.Join(t.lines, "\n") }

func readTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// shrinkPaths are removed from the rootfs: nothing at run time reads them.
// Each is a glob relative to the root.
var shrinkPaths = []string{
	"var/cache/apt/*.bin",
	"var/cache/apt/archives/*.deb",
	"var/cache/apt/archives/partial/*",
	"var/cache/debconf/*-old",
	"var/lib/apt/lists/*",
	"var/log/*",
	"usr/share/doc/*",
	"usr/share/man/*",
	"usr/share/info/*",
	"usr/share/lintian/*",
	"usr/share/linda/*",
	"usr/share/locale/*",
	"usr/share/doc-base/*",
	"usr/share/bug/*",
	"tmp/*",
	"var/tmp/*",
	"debootstrap",
}

// customize turns a fresh debootstrap tree into the sandbox root: the
// unprivileged user, its /workspace, no host identity, no caches or docs.
func customize(root string, r Recipe) error {
	if err := addUser(root, "sandbox", r.UID, r.GID, "/workspace"); err != nil {
		return fmt.Errorf("add user: %w", err)
	}
	ws := filepath.Join(root, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	// The runtime mounts a tmpfs here; the directory is only a mountpoint
	// but must belong to the user so that an unmounted run still works.
	if err := os.Chmod(ws, 0o755); err != nil {
		return err
	}
	if err := os.Lchown(ws, r.UID, r.GID); err != nil {
		return err
	}
	for _, g := range shrinkPaths {
		matches, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("shrink: %w", err)
			}
		}
	}
	// debootstrap copies the host's resolv.conf and hostname in; the image
	// must not carry them (the runtime supplies its own DNS setup).
	files := map[string]string{
		"etc/resolv.conf": "",
		"etc/hostname":    "sandbox\n",
		"etc/hosts":       "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/machine-id":  "",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	// /tmp must be world-writable and sticky whatever umask made it.
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(root, d), 0o777|os.ModeSticky); err != nil {
			return err
		}
	}
	return nil
}

// addUser appends name to passwd, group, shadow and gshadow, refusing if the
// name or ids are already taken (so a recipe clash is loud, not silent).
func addUser(root, name string, uid, gid int, home string) error {
	if err := checkFree(filepath.Join(root, "etc/passwd"), name, uid, 2); err != nil {
		return err
	}
	if err := checkFree(filepath.Join(root, "etc/group"), name, gid, 2); err != nil {
		return err
	}
	add := []struct {
		file, line string
		mode       os.FileMode
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d:airlock sandbox:%s:/bin/sh\n", name, uid, gid, home), 0o644},
		{"etc/group", fmt.Sprintf("%s:x:%d:\n", name, gid), 0o644},
		{"etc/shadow", fmt.Sprintf("%s:!:%d:0:99999:7:::\n", name, time.Now().Unix()/86400), 0o640},
		{"etc/gshadow", fmt.Sprintf("%s:!::\n", name), 0o640},
	}
	for _, a := range add {
		if err := appendLine(filepath.Join(root, a.file), a.line, a.mode); err != nil {
			return err
		}
	}
	return nil
}

// checkFree fails if name or the numeric id in column idCol is in use.
func checkFree(path, name string, id, idCol int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) <= idCol {
			continue
		}
		if f[0] == name {
			return fmt.Errorf("%s: %q already exists", path, name)
		}
		if n, err := strconv.Atoi(f[idCol]); err == nil && n == id {
			return fmt.Errorf("%s: id %d already used by %q", path, id, f[0])
		}
	}
	return nil
}

func appendLine(path, line string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, mode)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// removeTree deletes dir after unmounting anything under it. debootstrap
// mounts proc, sys and sometimes binds /dev inside its target; a plain
// RemoveAll on a tree with a live /dev bind would delete the host's devices.
func removeTree(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// unmountUnder detaches every mount at or below dir and checks none is left.
func unmountUnder(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	mounts, err := mountsUnder(abs)
	if err != nil {
		return err
	}
	// Deepest first, so parents unmount cleanly.
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", mounts[i], err)
		}
	}
	if left, err := mountsUnder(abs); err != nil {
		return err
	} else if len(left) > 0 {
		return fmt.Errorf("%s: still mounted after unmount: %v", abs, left)
	}
	return nil
}

// mountsUnder lists mount points at or below dir, in mountinfo order.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []string
	for _, line := range bytes.Split(b, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space etc.).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
