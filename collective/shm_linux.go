//go:build linux

package collective

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/durabletrain/durabletrain/internal/race"
)

// shmRing is the shared memory between a rank and its left neighbour on the
// same host: a header page holding a random token, then `slots` slots that the
// neighbour fills and this rank drains. One copy per byte instead of TCP's two,
// and no kernel networking on the data path.
type shmRing struct {
	mem       []byte
	slots     int
	slotBytes int
	// clock, in race builds only (race.Enabled), is shared by the two sides
	// of the ring when they are in one process: the detector cannot see the
	// order the ring's own counters give them through two mappings of one page.
	clock *atomic.Uint64
}

// raceClocks are the rings' clocks in race builds, by token.
var raceClocks sync.Map

func (r *shmRing) setClock(token []byte) *shmRing {
	if race.Enabled {
		c, _ := raceClocks.LoadOrStore(string(token), new(atomic.Uint64))
		r.clock = c.(*atomic.Uint64)
	}
	return r
}

// release and acquire order a side's use of a slot before the other
// side's, for the race detector (race.Enabled); they do nothing otherwise.
func (r *shmRing) release() {
	if r.clock != nil {
		r.clock.Add(1)
	}
}

func (r *shmRing) acquire() {
	if r.clock != nil {
		r.clock.Load()
	}
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
	// Allocated now, not as it is first written: a full /dev/shm (a
	// container's is often 64 MiB) then refuses the ring here, and the link
	// runs over TCP, where pages touched later would kill the process with
	// SIGBUS.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
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
	return (&shmRing{mem: mem, slots: slots, slotBytes: slotBytes}).setClock(token), f.Name(), token, nil
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
	return (&shmRing{mem: mem, slots: slots, slotBytes: slotBytes}).setClock(token), nil
}

func (r *shmRing) slot(i int) []byte {
	off := shmHeader + i*r.slotBytes
	return r.mem[off : off+r.slotBytes]
}

func (r *shmRing) close() { unix.Munmap(r.mem) }

// headerBytes is n bytes of the header page from off.
func (r *shmRing) headerBytes(off, n int) []byte { return r.mem[off : off+n] }

// The header page, after the token: four 32-bit words, each on its own
// cache line, and one descriptor per slot. Counters wrap (they are compared
// by difference); the futex words are the counters themselves.
const (
	shmConsumedOffset    = 64  // chunks the receiver has drained (receiver writes)
	shmPublishedOffset   = 128 // chunks the sender has filled (sender writes)
	shmRecvWaitingOffset = 192 // the receiver sleeps on published (receiver writes)
	shmSendWaitingOffset = 256 // the sender sleeps on consumed (sender writes)
	shmDescOffset        = 512 // slot i's descriptor: seq, op, length (16 bytes each)
	shmMaxSlots          = (shmHeader - shmDescOffset) / 16
)

func (r *shmRing) word(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[off]))
}

// consumed is the count of chunks the receiver has drained: the sender may
// reuse a slot once the chunk in it is consumed.
func (r *shmRing) consumed() *atomic.Uint32 { return r.word(shmConsumedOffset) }

// published is the count of chunks the sender has put in the ring.
func (r *shmRing) published() *atomic.Uint32 { return r.word(shmPublishedOffset) }

// recvWaiting and sendWaiting say that a side sleeps on its counter: the
// other side wakes it after moving the counter.
func (r *shmRing) recvWaiting() *atomic.Uint32 { return r.word(shmRecvWaitingOffset) }
func (r *shmRing) sendWaiting() *atomic.Uint32 { return r.word(shmSendWaitingOffset) }

// desc is slot i's descriptor: the operation's sequence number and kind,
// and the chunk's length in bytes. The sender writes it before publishing
// the slot, the receiver checks it before using the slot.
func (r *shmRing) desc(i int) (seq, op, length *atomic.Uint32) {
	off := shmDescOffset + 16*i
	return r.word(off), r.word(off + 4), r.word(off + 8)
}

// The futex operations (linux/futex.h), shared (not FUTEX_PRIVATE_FLAG).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == val, for at most d (or until futexWake).
// The words live in memory shared between processes: no FUTEX_PRIVATE_FLAG.
func futexWait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on w, in this process or the peer's.
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<30), 0, 0, 0)
}

// osYield gives the core to another runnable thread (sched_yield).
func osYield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
