package checkpoint

import (
	"cmp"
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to begin writing [off, off+n) of f to disk
// now, without waiting: with plenty of memory the kernel would otherwise hold
// a whole checkpoint in the page cache until the final fsync, leaving the disk
// idle while the object is hashed and written.
func startWriteback(f *os.File, off, n int64) {
	control(f, func(fd int) { unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE) })
}

// canDirect reports whether f's file system takes O_DIRECT with offsets,
// lengths and memory aligned to directAlign (statx's STATX_DIOALIGN, Linux
// 6.1 and later; on older kernels, or a file system that does not say, no).
func canDirect(f *os.File) bool {
	var st unix.Statx_t
	ok := false
	control(f, func(fd int) {
		err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st)
		ok = err == nil && st.Mask&unix.STATX_DIOALIGN != 0 &&
			st.Dio_mem_align > 0 && st.Dio_offset_align > 0 &&
			directAlign%st.Dio_mem_align == 0 && directAlign%st.Dio_offset_align == 0
	})
	return ok
}

// setDirect turns O_DIRECT on or off for f's open file.
func setDirect(f *os.File, on bool) error {
	var err error
	cerr := control(f, func(fd int) {
		var flags int
		if flags, err = unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil {
			return
		}
		if on {
			flags |= unix.O_DIRECT
		} else {
			flags &^= unix.O_DIRECT
		}
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	})
	return cmp.Or(cerr, err)
}

// cached reports whether every page of [off, off+n) of f is in the page
// cache (cachestat(2), Linux 6.5; on older kernels, no).
func cached(f *os.File, off, n int64) bool {
	var st unix.Cachestat_t
	ok := false
	control(f, func(fd int) {
		err := unix.Cachestat(uint(fd), &unix.CachestatRange{Off: uint64(off), Len: uint64(n)}, &st, 0)
		pages := (n + int64(os.Getpagesize()) - 1) / int64(os.Getpagesize())
		ok = err == nil && int64(st.Cache) >= pages
	})
	return ok
}

// isDirectRefused reports whether err is a file system refusing a direct
// read or write it had said it would take.
func isDirectRefused(err error) bool { return errors.Is(err, unix.EINVAL) }

// control runs fn with f's descriptor, without Fd's switch to blocking
// mode; it does not run fn (and says why) if f is closed.
func control(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}
