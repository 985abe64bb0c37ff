package collective

import (
	"encoding/binary"
	"unsafe"

	"gonum.org/v1/gonum/blas/gonum"
)

// The wire format of buffers is little-endian float32, which is the memory
// layout of every platform Go supports that we run on; asBytes is a view, not a copy.
func init() {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		panic("collective: big-endian hosts are not supported")
	}
}

func asBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// addInto sets dst[i] += src[i], through gonum's own vectorised saxpy, in
// the calling goroutine. Not blas32.Implementation(): a process built with
// OpenBLAS behind it (the native trainer's openblas tag) would sum a large
// chunk on OpenBLAS's threads, one per core unless OPENBLAS_NUM_THREADS says
// otherwise, which then spin in sched_yield beside the ranks' own work
// (measured: a third of a rank's samples in a 1 MiB all-reduce).
func addInto(dst, src []float32) {
	gonum.Implementation{}.Saxpy(len(dst), 1, src, 1, dst, 1)
}
