package checkpoint

import "unsafe"

// Direct I/O. On a local disk (file://, where the file system allows it)
// objects are written and read with O_DIRECT: the blocks go between our
// buffers and the disk without a copy through the page cache. A checkpoint is
// written once and read at most once or twice, long after; through the page
// cache every byte was copied once more by the kernel, into pages that on
// these VMs were often cold (first touch at 0.4 GB/s), and a 1 GiB checkpoint
// pushed the data set out of the cache. dd on this machine's disk, 1 GiB:
// 0.22–0.51 GB/s written through the cache (conv=fdatasync), 1.1–1.4 GB/s
// with oflag=direct; read 0.45–1.6 GB/s through the cache, 1.4–1.6 direct,
// and under load (a CPU-bound process per core) 0.45–0.91 against 1.5–1.6
// (BENCHMARKS.md, checkpoints, 2026-11-25). DeepSpeed's FastPersist writes
// checkpoints the same way.
//
// What stays as it was: fsync before the rename that publishes an object
// (O_DIRECT does not flush the disk's own cache), the manifest written
// last, and every block hashed. A block that is all in the page cache
// already (a checkpoint read back right after it was written through the
// cache, by an older version) is read through it. A file system that does
// not report an O_DIRECT alignment (STATX_DIOALIGN) our buffers meet, as
// tmpfs does not on Linux 6.18 here, is read and written through the cache,
// and so is one that takes O_DIRECT and then refuses a read or a write.

// directAlign is the alignment of our buffers, and the most that direct I/O
// may ask of offsets and lengths: a file system that wants more is used
// through the page cache.
const directAlign = 4096

// alignedBuffer is n bytes (rounded up to directAlign) starting at a
// directAlign boundary of memory, as O_DIRECT needs. Go's heap does not move
// objects, so the alignment holds for the buffer's life.
func alignedBuffer(n int) []byte {
	n = roundUp(n, directAlign)
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }
