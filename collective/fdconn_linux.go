package collective

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fdConn is a TCP connection read and written with plain system calls on a
// descriptor of its own, outside the Go runtime's network poller: the left
// link of a group, which every step of every operation waits on.
//
// Why: a connection in the runtime's poller wakes the poller's thread as
// each frame arrives, besides the goroutine waiting for it. Where a host has
// more processes than cores (4 ranks on 2 here), each wake is a thread that
// must get a core, and a small all-reduce step costs several: measured on 2
// cores, 4 ranks, a gathered 4 KiB all-reduce took 229-249 µs through the
// poller and 133-145 µs on descriptors of their own (BENCHMARKS.md). Where
// every rank has a core the poller did as well idle and better under load,
// so Join uses an fdConn only where ranks outnumber cores.
//
// Here the goroutine that reads waits in poll(2) itself, so an arrival
// wakes exactly the thread that reads, and while an operation is in
// progress it first looks for data for a while (lookFor), as MPI's
// progress loop does.
//
// Deadlines and Close wake a waiting poll(2) through an eventfd per
// direction. Reads are serialised among themselves and so are writes, as
// net.Conn's are; the descriptor is closed when the last call using it has
// returned, so a number reused by the process is never read.
type fdConn struct {
	fd            int
	local, remote net.Addr
	wake          [2]int // eventfds: [0] wakes a waiting reader, [1] a waiting writer
	poll          pollPolicy

	readMu, writeMu sync.Mutex
	mu              sync.Mutex // guards the fields below
	deadline        [2]time.Time
	closed          bool
	users           int
}

const (
	dirRead  = 0
	dirWrite = 1
)

// newFDConn moves c's socket out of the runtime's poller: it duplicates the
// descriptor and closes c (which takes the original out of the poller).
// Anything that is not a *net.TCPConn is returned as it is.
func newFDConn(c net.Conn, poll pollPolicy) (net.Conn, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var dupErr error
	if err := raw.Control(func(s uintptr) { fd, dupErr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, os.NewSyscallError("fcntl", dupErr)
	}
	fc := &fdConn{fd: fd, local: c.LocalAddr(), remote: c.RemoteAddr(), poll: poll, wake: [2]int{-1, -1}}
	for i := range fc.wake {
		if fc.wake[i], err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			fc.closeFDs()
			return nil, os.NewSyscallError("eventfd", err)
		}
	}
	// The duplicate shares the original's open file description, non-blocking
	// mode included; closing the original takes it out of the poller only.
	if err := unix.SetNonblock(fd, true); err != nil {
		fc.closeFDs()
		return nil, os.NewSyscallError("fcntl", err)
	}
	c.Close()
	return fc, nil
}

func (c *fdConn) closeFDs() {
	for _, fd := range []int{c.fd, c.wake[0], c.wake[1]} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// acquire marks a call using the descriptor; false once the connection is closed.
func (c *fdConn) acquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.users++
	return true
}

func (c *fdConn) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users--; c.users == 0 && c.closed {
		c.closeFDs()
	}
}

func (c *fdConn) Read(p []byte) (int, error) {
	return c.reading(p, false)
}

// reading reads into p under readMu, with the descriptor held. Unless
// once, it waits for data (looking for it first while an operation is in
// progress, lookFor); once, it returns 0 and no error when none has
// arrived, and fails at once after the read deadline (the progress loop's
// tryRead).
func (c *fdConn) reading(p []byte, once bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.release()
	if once {
		c.mu.Lock()
		deadline := c.deadline[dirRead]
		c.mu.Unlock()
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, os.ErrDeadlineExceeded
		}
	}
	looked := false
	for {
		n, err := syscall.Read(c.fd, p) // syscall's Read tells the race detector of the I/O
		if err == syscall.EINTR {
			continue
		}
		if n, err = nbResult(n, err, true); err != nil && err != io.EOF {
			err = c.closedOr(c.opError("read", err))
		}
		if n > 0 || err != nil || once {
			return n, err
		}
		if !looked && c.poll.active != nil && c.poll.active.Load() && c.poll.window > 0 {
			looked = true
			if c.lookFor() {
				continue
			}
		}
		if err := c.wait(dirRead, unix.POLLIN); err != nil {
			return 0, err
		}
	}
}

// lookFor polls the socket for data for up to the policy's window, while an
// operation is in progress; it reports whether data came.
func (c *fdConn) lookFor() bool {
	if c.poll.yield != nil && !c.poll.yield.ready() {
		return false // a yield lately lost the core to a process not of ours
	}
	until := time.Now().Add(c.poll.window)
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	for i := 1; ; i++ {
		if n, _ := unix.Poll(fds, 0); n > 0 {
			return true
		}
		if c.poll.yield == nil {
			runtime.Gosched()
		} else if !c.poll.yield.yield() {
			return false
		}
		if i%16 == 0 && (time.Now().After(until) || !c.poll.active.Load()) {
			return false
		}
	}
}

func (c *fdConn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if !c.acquire() {
		return 0, net.ErrClosed
	}
	defer c.release()
	done := 0
	for done < len(p) {
		n, err := syscall.Write(c.fd, p[done:])
		if n > 0 {
			done += n
			continue
		}
		switch err {
		case nil:
			return done, io.ErrShortWrite // write(2) of bytes wrote none, and said nothing
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if err := c.wait(dirWrite, unix.POLLOUT); err != nil {
				return done, err
			}
			continue
		}
		return done, c.closedOr(c.opError("write", err))
	}
	return done, nil
}

// wait sleeps in poll(2) until the socket is ready for events, the
// direction's deadline passes, or its eventfd wakes it (a new deadline, Close).
func (c *fdConn) wait(dir int, events int16) error {
	for {
		c.mu.Lock()
		closed, deadline := c.closed, c.deadline[dir]
		c.mu.Unlock()
		if closed {
			return net.ErrClosed
		}
		timeout := -1
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			timeout = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: events}, {Fd: int32(c.wake[dir]), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if err == unix.EINTR || n == 0 {
			continue // the deadline is checked again above
		}
		if err != nil {
			return os.NewSyscallError("poll", err)
		}
		if fds[1].Revents != 0 {
			var b [8]byte
			unix.Read(c.wake[dir], b[:]) // drain; look at deadline and closed again
		}
		if fds[0].Revents != 0 {
			return nil // ready, or an error or hang-up the next call reports
		}
	}
}

// opError is a failed system call, said as net.Conn says it ("read tcp
// 10.0.0.1:4000->10.0.0.2:5000: read: connection reset by peer").
func (c *fdConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.local, Addr: c.remote, Err: os.NewSyscallError(op, err)}
}

// closedOr is net.ErrClosed once the connection is closed, else err.
func (c *fdConn) closedOr(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	return err
}

// Close shuts the socket down, which wakes and fails every call in
// progress; the descriptor itself is closed when the last of them returns.
func (c *fdConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.closed = true
	unix.Shutdown(c.fd, unix.SHUT_RDWR)
	c.kick(dirRead)
	c.kick(dirWrite)
	if c.users == 0 {
		c.closeFDs()
	}
	return nil
}

// kick wakes a call of direction dir waiting in poll(2). Under c.mu.
func (c *fdConn) kick(dir int) {
	var one [8]byte
	one[0] = 1
	unix.Write(c.wake[dir], one[:])
}

func (c *fdConn) setDeadline(dir int, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.deadline[dir] = t
	c.kick(dir)
	return nil
}

func (c *fdConn) SetReadDeadline(t time.Time) error  { return c.setDeadline(dirRead, t) }
func (c *fdConn) SetWriteDeadline(t time.Time) error { return c.setDeadline(dirWrite, t) }
func (c *fdConn) SetDeadline(t time.Time) error {
	return errors.Join(c.setDeadline(dirRead, t), c.setDeadline(dirWrite, t))
}

func (c *fdConn) LocalAddr() net.Addr  { return c.local }
func (c *fdConn) RemoteAddr() net.Addr { return c.remote }
