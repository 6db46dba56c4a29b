package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Workspace is the directory file operations are relative to.
const Workspace = "/workspace"

// maxEntries bounds a listing.
const maxEntries = 1000

// fileOpMain is the helper mode: one FileOp from stdin, its FileResult to
// stdout. It runs as the code's user, started by the driver.
func fileOpMain(root string, stdin io.Reader, stdout io.Writer) int {
	var op FileOp
	if err := json.NewDecoder(io.LimitReader(stdin, MaxFrame)).Decode(&op); err != nil {
		_ = json.NewEncoder(stdout).Encode(FileResult{Error: "bad file operation: " + err.Error()})
		return 0
	}
	_ = json.NewEncoder(stdout).Encode(doFileOp(root, op))
	return 0
}

// doFileOp performs op below root. Every component is opened relative to
// the one before with O_NOFOLLOW, so a symlink anywhere on the way is
// refused, not followed: what the code planted cannot redirect the
// operation, inside the sandbox or out of it.
func doFileOp(root string, op FileOp) FileResult {
	parts, err := CheckPath(op.Path, op.Op == "list" || op.Op == "collect")
	if err != nil {
		return FileResult{Error: err.Error()}
	}
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return FileResult{Error: fmt.Sprintf("open %s: %v", root, err)}
	}
	defer func() { unix.Close(dir) }()
	walk := parts
	if op.Op != "list" && op.Op != "collect" {
		walk = parts[:len(parts)-1]
	}
	for _, c := range walk {
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && op.Op == "write" {
			if err := unix.Mkdirat(dir, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return FileResult{Error: fmt.Sprintf("create directory %s: %v", c, err)}
			}
			next, err = unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return FileResult{Error: describe(op.Path, c, err)}
		}
		unix.Close(dir)
		dir = next
	}
	switch op.Op {
	case "write":
		name := parts[len(parts)-1]
		perm := uint32(0o644)
		if op.Mode != 0 {
			perm = op.Mode & 0o777
		}
		// Non-blocking: a FIFO the code left under the name would hang
		// the open until someone read it; it is refused (ENXIO) instead.
		fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
		if err != nil {
			return FileResult{Error: describe(op.Path, name, err)}
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return FileResult{Error: describe(op.Path, name, err)}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return FileResult{Error: fmt.Sprintf("%s is not a regular file", op.Path)}
		}
		if op.Mode != 0 {
			// Before the data: a file that was there keeps its mode
			// through O_CREAT, and the umask may have narrowed a new one.
			if err := unix.Fchmod(fd, perm); err != nil {
				return FileResult{Error: describe(op.Path, name, err)}
			}
		}
		if _, err := f.Write(op.Data); err != nil {
			// No half-written file is left for the code to trip on.
			_ = unix.Unlinkat(dir, name, 0)
			return FileResult{Error: describe(op.Path, name, err)}
		}
		return FileResult{Size: int64(len(op.Data))}
	case "read":
		name := parts[len(parts)-1]
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return FileResult{Error: describe(op.Path, name, err)}
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return FileResult{Error: err.Error()}
		}
		if !st.Mode().IsRegular() {
			return FileResult{Error: fmt.Sprintf("%s is not a regular file", op.Path)}
		}
		max := op.MaxBytes
		if max <= 0 || max > MaxFrame/2 {
			max = MaxFrame / 2
		}
		data, err := io.ReadAll(io.LimitReader(f, max))
		if err != nil {
			return FileResult{Error: fmt.Sprintf("read %s: %v", op.Path, err)}
		}
		return FileResult{Data: data, Size: st.Size(), Truncated: st.Size() > int64(len(data))}
	case "list":
		fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return FileResult{Error: describe(op.Path, ".", err)}
		}
		f := os.NewFile(uintptr(fd), op.Path)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return FileResult{Error: fmt.Sprintf("list %s: %v", op.Path, err)}
		}
		sort.Strings(names)
		res := FileResult{Entries: []Entry{}}
		for _, n := range names {
			if len(res.Entries) >= maxEntries {
				res.Truncated = true
				break
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue
			}
			e := Entry{Name: n, Size: st.Size, Type: "other"}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				e.Type = "file"
			case unix.S_IFDIR:
				e.Type = "dir"
			case unix.S_IFLNK:
				e.Type = "symlink"
			}
			res.Entries = append(res.Entries, e)
		}
		return res
	case "collect":
		caps := DefaultRichCaps
		if op.Caps != nil {
			caps = *op.Caps
		}
		c := collector{since: op.Since, caps: caps, budget: caps.EmbedTotalBytes}
		c.walk(dir, strings.Join(parts, "/"), 0)
		return FileResult{Files: c.files, Truncated: c.truncated}
	default:
		return FileResult{Error: fmt.Sprintf("unknown file operation %q", op.Op)}
	}
}

// describe turns an open error into what the caller should know.
func describe(p, component string, err error) string {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EMLINK):
		return fmt.Sprintf("%s: %q is a symbolic link; file operations do not follow links", p, component)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Sprintf("%s: %q is not a directory (or is a symbolic link, which is not followed)", p, component)
	case errors.Is(err, unix.ENOENT):
		return fmt.Sprintf("%s: no such file or directory in /workspace", p)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Sprintf("%s: permission denied", p)
	case errors.Is(err, unix.ENOSPC):
		return fmt.Sprintf("%s: the workspace is full (limits.workspace_mb)", p)
	case errors.Is(err, unix.EISDIR):
		return fmt.Sprintf("%s is a directory", p)
	case errors.Is(err, unix.ENXIO):
		return fmt.Sprintf("%s is not a regular file", p)
	default:
		return fmt.Sprintf("%s: %v", p, err)
	}
}

// Bounds of a collect walk, so a deep or wide tree cannot stall the driver.
const (
	maxCollectDepth = 16
	maxCollectSeen  = 10000
)

// collector gathers the files a run left under OutDir.
type collector struct {
	since     int64
	caps      RichCaps
	budget    int
	seen      int
	files     []OutFile
	truncated bool
}

// walk visits the directory open at dir, named rel (relative to
// /workspace), in name order. Like every file operation it opens each
// entry relative to its directory without following links.
func (c *collector) walk(dir int, rel string, depth int) {
	fd, err := unix.Openat(dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return
	}
	sort.Strings(names)
	for _, n := range names {
		if c.seen++; c.seen > maxCollectSeen || len(c.files) >= c.caps.MaxFiles {
			c.truncated = true
			return
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if depth+1 >= maxCollectDepth {
				c.truncated = true
				continue
			}
			sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			c.walk(sub, rel+"/"+n, depth+1)
			unix.Close(sub)
		case unix.S_IFREG:
			if st.Mtim.Nano() < c.since {
				continue
			}
			out := OutFile{Path: rel + "/" + n, Size: st.Size}
			if st.Size <= int64(c.caps.EmbedBytes) && st.Size <= int64(c.budget) {
				out.Content = c.read(fd, n, st.Size)
				c.budget -= len(out.Content)
			}
			c.files = append(c.files, out)
		}
	}
}

// read returns a small file's content, or nil if it is not what it was
// when listed.
func (c *collector) read(dir int, name string, size int64) []byte {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, size+1))
	if err != nil || int64(len(data)) != size {
		return nil
	}
	return data
}
