package approval

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// minFreeBytes is the space a filesystem must have left for the log to be
// called writable: a record is a few KiB unless it carries large code.
const minFreeBytes = 4 << 20

// writable reports why f cannot take another record: its filesystem is
// mounted read-only, or nearly full. Writing zero bytes would not tell:
// the kernel answers a zero-length write before it looks at either.
func writable(f *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("its filesystem is mounted read-only: %w", unix.EROFS)
	}
	if free := st.Bavail * uint64(st.Bsize); free < minFreeBytes {
		return fmt.Errorf("only %d bytes free on its filesystem: %w", free, unix.ENOSPC)
	}
	if _, err := f.Stat(); err != nil {
		return errors.Join(errors.New("the open log file is gone"), err)
	}
	return nil
}
