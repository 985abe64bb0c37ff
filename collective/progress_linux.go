package collective

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nbLinkOf is c as an nbLink, or nil where c is not a TCP connection.
func nbLinkOf(c net.Conn) nbLink {
	switch c := c.(type) {
	case *fdConn:
		return c
	case *net.TCPConn:
		raw, err := c.SyscallConn()
		if err != nil {
			return nil
		}
		return rawTCP{raw}
	}
	return nil
}

// rawTCP is a connection in the runtime's poller, read and written through
// its syscall.RawConn: each call holds the descriptor and honours the
// connection's deadlines, and a callback that reports done never parks.
type rawTCP struct{ raw syscall.RawConn }

func (r rawTCP) tryRead(p []byte) (int, error) {
	var n int
	var serr error
	err := r.raw.Read(func(fd uintptr) bool {
		for {
			n, serr = syscall.Read(int(fd), p)
			if serr != syscall.EINTR {
				return true
			}
		}
	})
	if err != nil {
		return 0, err
	}
	return nbResult(n, serr, true)
}

func (r rawTCP) tryWritev(bufs [][]byte) (int, error) {
	var n int
	var serr error
	err := r.raw.Write(func(fd uintptr) bool {
		for {
			n, serr = unix.Writev(int(fd), bufs)
			if serr != syscall.EINTR {
				return true
			}
		}
	})
	if err != nil {
		return 0, err
	}
	return nbResult(n, serr, false)
}

func (r rawTCP) hold(f func(fd int)) error {
	return r.raw.Control(func(fd uintptr) { f(int(fd)) })
}

// nbResult says a non-blocking read's or write's outcome as nbLink does.
func nbResult(n int, err error, read bool) (int, error) {
	switch {
	case n > 0:
		return n, nil
	case err == syscall.EAGAIN:
		return 0, nil
	case err != nil:
		return 0, err
	case read && n == 0:
		return 0, io.EOF
	}
	return 0, nil
}

func (c *fdConn) tryRead(p []byte) (int, error) { return c.reading(p, true) }

func (c *fdConn) tryWritev(bufs [][]byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.release()
	for {
		n, err := unix.Writev(c.fd, bufs)
		if err == syscall.EINTR {
			continue
		}
		if n, err = nbResult(n, err, false); err != nil {
			err = c.closedOr(c.opError("write", err))
		}
		return n, err
	}
}

func (c *fdConn) hold(f func(fd int)) error {
	if !c.acquire() {
		return net.ErrClosed
	}
	defer c.release()
	f(c.fd)
	return nil
}

// progressWaker wakes a progress loop waiting in poll(2) when the group
// fails: an eventfd, written once by fail and never drained, so that every
// later wait returns at once too.
type progressWaker struct{ fd int }

func newProgressWaker() (*progressWaker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("eventfd", err)
	}
	return &progressWaker{fd: fd}, nil
}

func (w *progressWaker) wake() {
	var one [8]byte
	one[0] = 1
	unix.Write(w.fd, one[:])
}

func (w *progressWaker) close() { unix.Close(w.fd) }

// await sleeps in poll(2) until the left link has data (read), the right
// one has room (write), the group fails, or timeout passes (negative: no
// limit). With hangup, it also wakes when the left neighbour shuts its
// side of the link, and reports that.
func (w *progressWaker) await(left, right nbLink, read, write, hangup bool, timeout time.Duration) (hungUp bool) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	fds := [3]unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	k, l := 1, -1
	left.hold(func(lfd int) {
		right.hold(func(rfd int) {
			if read || hangup {
				var ev int16 = unix.POLLRDHUP
				if read {
					ev |= unix.POLLIN
				}
				fds[k], l = unix.PollFd{Fd: int32(lfd), Events: ev}, k
				k++
			}
			if write {
				fds[k] = unix.PollFd{Fd: int32(rfd), Events: unix.POLLOUT}
				k++
			}
			unix.Poll(fds[:k], ms)
		})
	})
	return l > 0 && fds[l].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
}

// readable reports whether the link has bytes to read now (or an end of
// stream, or an error, that the next read reports).
func readable(l nbLink) bool {
	ready := false
	l.hold(func(fd int) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		ready = err == nil && n > 0
	})
	return ready
}
