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

func (s *spinReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	var until time.Time
	spins := 0
	err := s.raw.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr == syscall.EAGAIN:
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
			return true
		}
	})
	if err != nil {
		return 0, err // deadline or closed connection, as net.Conn reports them
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: rerr}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}
