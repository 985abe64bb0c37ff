package checkpoint

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to begin writing [off, off+n) of f to disk
// now, without waiting: with plenty of memory the kernel would otherwise hold
// a whole checkpoint in the page cache until the final fsync, leaving the disk
// idle while the object is hashed and written.
func startWriteback(f *os.File, off, n int64) {
	unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
