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
