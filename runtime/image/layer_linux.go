package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// emptiedDirs keep their own entry in the layer but none of their contents:
// the runtime (runsc) supplies /dev, /proc and /sys, and whatever debootstrap
// left there (device nodes, mount remnants) belongs to the build host.
var emptiedDirs = map[string]bool{"dev": true, "proc": true, "sys": true}

// keptXattrs are carried into the layer; others (security.selinux and the
// like) describe the build host rather than the image.
var keptXattrs = []string{"security.capability"}

// writeLayer writes root as an uncompressed OCI layer tar to w. It walks the
// tree itself rather than using tar.FileInfoHeader so that ownership is the
// numeric uid/gid on disk (no host user names looked up), hardlinks stay
// hardlinks, and nothing outside root is followed.
func writeLayer(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if isWhiteout(rel) {
			return fmt.Errorf("%s: whiteout name in rootfs", rel)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", path)
		}
		hdr := &tar.Header{
			Name:    rel,
			Mode:    int64(st.Mode & 0o7777),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: fi.ModTime().Truncate(time.Second),
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case syscall.S_IFREG:
			if st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := seen[key]; ok {
					hdr.Typeflag = tar.TypeLink
					hdr.Linkname = first
					break
				}
				seen[key] = rel
			}
			hdr.Typeflag = tar.TypeReg
			hdr.Size = st.Size
		case syscall.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = target
		case syscall.S_IFCHR, syscall.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if st.Mode&syscall.S_IFMT == syscall.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor = int64(unix.Major(st.Rdev))
			hdr.Devminor = int64(unix.Minor(st.Rdev))
		case syscall.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			// Sockets cannot live in a tar and mean nothing in an image.
			return nil
		}
		if hdr.Typeflag != tar.TypeLink {
			if err := addXattrs(hdr, path); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			if err := copyFile(tw, path, hdr.Size); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		if hdr.Typeflag == tar.TypeDir && emptiedDirs[rel] {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("layer tar: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("layer tar: %w", err)
	}
	return nil
}

// copyFile copies exactly size bytes: a file that changed under the walk
// would otherwise corrupt the tar stream.
func copyFile(w io.Writer, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("file shrank while archiving (%d of %d bytes)", n, size)
	}
	return nil
}

func addXattrs(hdr *tar.Header, path string) error {
	for _, name := range keptXattrs {
		buf := make([]byte, 256)
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
			continue
		}
		if errors.Is(err, unix.ERANGE) {
			if n, err = unix.Lgetxattr(path, name, nil); err == nil {
				buf = make([]byte, n)
				n, err = unix.Lgetxattr(path, name, buf)
			}
		}
		if err != nil {
			return fmt.Errorf("xattr %s on %s: %w", name, path, err)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(buf[:n])
		hdr.Format = tar.FormatPAX
	}
	return nil
}

// isWhiteout reports names an OCI layer would read as deletions; a rootfs
// holding one would silently lose files on unpack.
func isWhiteout(name string) bool {
	return strings.HasPrefix(filepath.Base(name), ".wh.")
}
