package collective

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// spinReader reads a TCP connection, busy-polling the socket for up to
// `window` before parking on the netpoller, but only while *active is set
// (an operation is in progress). Waking a parked process costs tens of
// microseconds on a VM, more than a whole small all-reduce step; MPI and NCCL
// poll for the same reason. Idle groups never spin.
type spinReader struct {
	raw    syscall.RawConn
	conn   net.Conn
	window time.Duration
	active *atomic.Bool
}

func newSpinReader(conn net.Conn, window time.Duration, active *atomic.Bool) io.Reader {
	sc, ok := conn.(syscall.Conn)
	if !ok || window <= 0 {
		return conn
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return conn
	}
	return &spinReader{raw: raw, conn: conn, window: window, active: active}
}

// Read polls for readability without consuming (recv with MSG_PEEK), then
// reads through net.Conn, so that the runtime's happens-before bookkeeping for
// network I/O (which the race detector relies on) stays intact.
func (s *spinReader) Read(p []byte) (int, error) {
	if len(p) == 0 || !s.active.Load() {
		return s.conn.Read(p)
	}
	var peek [1]byte
	var until time.Time
	spins := 0
	err := s.raw.Read(func(fd uintptr) bool {
		for {
			_, _, err := syscall.Recvfrom(int(fd), peek[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				if !s.active.Load() {
					return false // park until readable
				}
				if until.IsZero() {
					until = time.Now().Add(s.window)
				}
				if spins++; spins%64 == 0 && time.Now().After(until) {
					return false
				}
				runtime.Gosched() // let the goroutine we just woke run on this P
				continue
			}
			return true // data, end of stream, or an error: conn.Read reports it
		}
	})
	if err != nil {
		return 0, err // deadline or closed connection, as net.Conn reports them
	}
	return s.conn.Read(p)
}

// pollPolicy is how a reader looks for data before it sleeps
// (fdconn_linux.go).
type pollPolicy struct {
	active *atomic.Bool  // look only while this is set (an operation is in progress)
	window time.Duration // for how long
	// yield, when set, gives the core up between looks: for hosts with more
	// ranks than cores, where a busy look would take the core from the rank
	// we wait for.
	yield *coreYielder
}

// coreYielder gives the core up (sched_yield) between a rank's looks for
// its neighbour's data, where a host has more ranks than cores: the rank
// looked for may be the one that needs the core. Idle, a yield comes back
// in microseconds, after a peer ran. Beside a CPU-bound process it comes
// back only when that process's time slice ends (3-4 ms): then looking only
// feeds it, so the yielder holds off (callers sleep until woken) for
// yieldBackoff, and tries again after.
type coreYielder struct {
	heldOffUntil atomic.Int64 // unix nanos
	longInARow   atomic.Int32 // yields in a row that took longer than yieldTooLong
}

const (
	// yieldTooLong: a yield that kept the rank off its core longer gave
	// the core to a process other than its peers, or a peer's thread ran
	// long, or the machine's own host took the core: longYields of them in
	// a row are load (idle, single ones came often enough on this VM to
	// hold shared-memory links off most of the time).
	yieldTooLong = 500 * time.Microsecond
	longYields   = 3
	// yieldBackoff: while load lasts, one try costs a time slice every
	// yieldBackoff, about 2% of the time.
	yieldBackoff = 200 * time.Millisecond
)

// ready reports whether yielding is not held off.
func (y *coreYielder) ready() bool { return time.Now().UnixNano() >= y.heldOffUntil.Load() }

// yield gives the core up once; false when it was the last of longYields
// in a row that took too long, and yielding is now held off.
func (y *coreYielder) yield() bool { return y.pass(osYield) }

// gosched gives the goroutine up once, not the core, and judges the time
// it took as yield does: on a loaded host the system takes the core from
// a rank that looks, and a look then takes a time slice.
func (y *coreYielder) gosched() bool { return y.pass(runtime.Gosched) }

func (y *coreYielder) pass(giveUp func()) bool {
	t := time.Now()
	giveUp()
	now := time.Now()
	if now.Sub(t) <= yieldTooLong {
		y.longInARow.Store(0)
		return true
	}
	if y.longInARow.Add(1) < longYields {
		return true
	}
	y.longInARow.Store(0)
	y.heldOffUntil.Store(now.Add(yieldBackoff).UnixNano())
	return false
}
