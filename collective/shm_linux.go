//go:build linux

package collective

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmRing is the shared memory between a rank and its left neighbour on the
// same host: a header page holding a random token, then `slots` slots that the
// neighbour fills and this rank drains. One copy per byte instead of TCP's two,
// and no kernel networking on the data path.
type shmRing struct {
	mem       []byte
	slots     int
	slotBytes int
}

const (
	shmHeader   = 4096
	shmTokenLen = 32
	shmDir      = "/dev/shm"
	shmPrefix   = "durabletrain-collective-"
)

// createShmRing makes a ring in /dev/shm; the caller unlinks path once the
// peer has answered (the mappings outlive the name).
func createShmRing(slots, slotBytes int) (ring *shmRing, path string, token []byte, err error) {
	f, err := os.CreateTemp(shmDir, shmPrefix+"*")
	if err != nil {
		return nil, "", nil, err
	}
	defer f.Close()
	size := shmHeader + slots*slotBytes
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(f.Name())
		return nil, "", nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(f.Name())
		return nil, "", nil, err
	}
	token = make([]byte, shmTokenLen)
	rand.Read(token)
	copy(mem, token)
	return &shmRing{mem: mem, slots: slots, slotBytes: slotBytes}, f.Name(), token, nil
}

// openShmRing maps a peer's ring and proves it is the same memory by its token.
// The path comes from the peer: only a ring createShmRing could have made
// (a regular file of ours in /dev/shm, not a link, not a FIFO or a device)
// is opened.
func openShmRing(path string, slots, slotBytes int, token []byte) (*shmRing, error) {
	if filepath.Dir(path) != shmDir || !strings.HasPrefix(filepath.Base(path), shmPrefix) || filepath.Clean(path) != path {
		return nil, fmt.Errorf("shared memory %q is not a collective ring in %s", path, shmDir)
	}
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := shmHeader + slots*slotBytes
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || st.Size() != int64(size) {
		return nil, fmt.Errorf("shared memory %s is not %d bytes", path, size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(mem[:shmTokenLen], token) {
		unix.Munmap(mem)
		return nil, fmt.Errorf("shared memory %s holds another token: not the peer's memory", path)
	}
	return &shmRing{mem: mem, slots: slots, slotBytes: slotBytes}, nil
}

func (r *shmRing) slot(i int) []byte {
	off := shmHeader + i*r.slotBytes
	return r.mem[off : off+r.slotBytes]
}

func (r *shmRing) close() { unix.Munmap(r.mem) }

// consumed is the count of chunks the receiver has drained, published in the
// header page: the sender may reuse a slot once the chunk in it is consumed.
func (r *shmRing) consumed() *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[shmConsumedOffset]))
}

// shmConsumedOffset is where the consumed counter lives (8-byte aligned, after the token).
const shmConsumedOffset = 64
