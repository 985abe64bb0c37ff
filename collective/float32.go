package collective

import (
	"encoding/binary"
	"unsafe"

	"gonum.org/v1/gonum/blas/blas32"
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

// addInto sets dst[i] += src[i], through gonum's vectorised saxpy.
func addInto(dst, src []float32) {
	blas32.Implementation().Saxpy(len(dst), 1, src, 1, dst, 1)
}
