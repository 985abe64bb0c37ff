package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Listener accepts the connections of every gang a worker process takes part
// in, reads each one's hello and hands it to the Join waiting for it. One
// Listener serves any number of ranks and gangs at once.
//
// The port is open to the network, so the listener assumes strangers: a
// connection must say hello within helloTimeout; one remote host may hold at
// most maxConnsPerHost connections that have not proved the run's secret; a
// hello for a connection no Join waits for yet is parked (a rank may dial
// before its neighbour is ready) among at most maxParked others, the oldest
// closed first, for at most parkTimeout; and every candidate for a waiting
// Join is authenticated concurrently with the others, so an impostor who
// knows the run, generation and ranks costs the real peer nothing.
type Listener struct {
	ln  net.Listener
	log *zap.Logger

	mu       sync.Mutex
	expected map[connKey]*expectation
	parked   []*helloConn   // oldest first
	perHost  map[string]int // unauthenticated connections per remote host
	closed   bool

	refusals refusalLog
}

const (
	// helloTimeout: a peer sends its hello at once; a connection that does not is a stranger's.
	helloTimeout = 5 * time.Second
	// parkTimeout is how long a hello waits for its Join; the dialer retries after it.
	parkTimeout = 10 * time.Second
	// maxParked bounds hellos that no Join waits for yet.
	maxParked = 1024
	// maxConnsPerHost bounds one remote host's connections that have not
	// authenticated: reading their hello, parked or in a handshake. A host
	// with 8 ranks in a few gangs dials a few dozen at most.
	maxConnsPerHost = 64
)

// expectation is a Join waiting for one connection.
type expectation struct {
	secret []byte
	flags  byte          // the accepting rank's, sent to the dialer (hello.Flags)
	ready  chan struct{} // closed when conn is set

	mu       sync.Mutex
	conn     net.Conn
	theirs   byte // the dialer's hello.Flags
	finished bool // the Join returned: later arrivals are closed
}

// deliver hands an authenticated connection to the Join, or reports false if
// the Join has one already or has returned.
func (e *expectation) deliver(c net.Conn, theirs byte) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished || e.conn != nil {
		return false
	}
	e.conn, e.theirs = c, theirs
	close(e.ready)
	return true
}

// Listen opens a TCP listener for collective connections on addr ("host:port";
// port 0 picks a free one). A nil logger logs nothing.
func Listen(addr string, log *zap.Logger) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("collective: listening on %q: %w", addr, err)
	}
	return NewListener(ln, log), nil
}

// NewListener serves collective connections on an existing listener.
func NewListener(ln net.Listener, log *zap.Logger) *Listener {
	if log == nil {
		log = zap.NewNop()
	}
	l := &Listener{ln: ln, log: log, expected: map[connKey]*expectation{}, perHost: map[string]int{}}
	l.refusals.log = log
	go l.acceptLoop()
	return l
}

// Addr is the address the listener is bound to, for the gang's peer list.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting; groups already joined keep their connections.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	parked := l.parked
	l.parked = nil
	l.mu.Unlock()
	for _, p := range parked {
		p.Close()
	}
	return l.ln.Close()
}

func (l *Listener) acceptLoop() {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("collective accept failed", zap.Error(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go l.route(conn)
	}
}

// admit counts a new unauthenticated connection against its host's limit.
func (l *Listener) admit(host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.perHost[host] >= maxConnsPerHost {
		return false
	}
	l.perHost[host]++
	return true
}

// release ends a connection's unauthenticated life.
func (l *Listener) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perHost[host]--; l.perHost[host] <= 0 {
		delete(l.perHost, host)
	}
}

func remoteHost(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// route reads a connection's hello and authenticates it for the Join waiting
// for it, or parks it until that Join arrives.
func (l *Listener) route(conn net.Conn) {
	host := remoteHost(conn)
	if !l.admit(host) {
		l.refusals.note("listener closed or too many unauthenticated connections from this host", conn, nil)
		conn.Close()
		return
	}
	conn.SetReadDeadline(time.Now().Add(helloTimeout))
	h, err := readHello(conn)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		l.release(host)
		l.refusals.note("bad hello", conn, err)
		conn.Close()
		return
	}
	hc := &helloConn{Conn: conn, hello: h, host: host}
	l.mu.Lock()
	if exp := l.expected[h.key()]; exp != nil {
		l.mu.Unlock()
		l.authenticate(exp, hc)
		return
	}
	if l.closed {
		l.mu.Unlock()
		l.release(host)
		conn.Close()
		return
	}
	var evicted *helloConn
	if len(l.parked) >= maxParked {
		evicted, l.parked = l.parked[0], l.parked[1:]
	}
	l.parked = append(l.parked, hc)
	l.mu.Unlock()
	if evicted != nil {
		l.refuseParked(evicted, "too many hellos waiting for their rank: the oldest closed")
	}
	time.AfterFunc(parkTimeout, func() {
		if l.unpark(hc) {
			l.refuseParked(hc, "no rank claimed it in time")
		}
	})
}

// unpark takes a connection out of the parked ones; false if a Join claimed it.
func (l *Listener) unpark(hc *helloConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range l.parked {
		if p == hc {
			l.parked = append(l.parked[:i], l.parked[i+1:]...)
			return true
		}
	}
	return false
}

func (l *Listener) refuseParked(hc *helloConn, why string) {
	l.release(hc.host)
	l.refusals.note(why, hc, nil)
	hc.Close()
}

// authenticate runs the acceptor's handshake and hands the connection to its Join.
func (l *Listener) authenticate(exp *expectation, hc *helloConn) {
	err := acceptHandshake(hc.Conn, exp.secret, hc.hello, exp.flags)
	l.release(hc.host)
	if err != nil {
		l.refusals.note("handshake failed", hc, err)
		hc.Close()
		return
	}
	if !exp.deliver(hc.Conn, hc.hello.Flags) {
		hc.Close()
	}
}

// helloConn is a connection whose hello has been read by the listener.
type helloConn struct {
	net.Conn
	hello hello
	host  string
}

// accept waits for an authenticated connection for the given key: every
// candidate, parked before or arriving now, is verified with the secret on
// its own goroutine; the first that proves it wins. flags are this rank's,
// sent to the dialer; it returns the dialer's.
func (l *Listener) accept(ctx context.Context, k connKey, secret []byte, flags byte) (net.Conn, byte, error) {
	exp := &expectation{secret: secret, flags: flags, ready: make(chan struct{})}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, 0, errors.New("collective: listener is closed")
	}
	if l.expected[k] != nil {
		l.mu.Unlock()
		return nil, 0, fmt.Errorf("collective: another Join already waits for rank %d's connection in run %q generation %d", k.from, k.run, k.gen)
	}
	l.expected[k] = exp
	var claimed []*helloConn
	kept := l.parked[:0]
	for _, p := range l.parked {
		if p.hello.key() == k {
			claimed = append(claimed, p)
		} else {
			kept = append(kept, p)
		}
	}
	clear(l.parked[len(kept):])
	l.parked = kept
	l.mu.Unlock()
	for _, p := range claimed {
		go l.authenticate(exp, p)
	}
	defer func() {
		l.mu.Lock()
		delete(l.expected, k)
		l.mu.Unlock()
	}()
	select {
	case <-exp.ready:
		return exp.conn, exp.theirs, nil
	case <-ctx.Done():
		exp.mu.Lock()
		exp.finished = true
		c, theirs := exp.conn, exp.theirs
		exp.mu.Unlock()
		if c != nil {
			return c, theirs, nil // it arrived as we gave up: take it
		}
		return nil, 0, ctx.Err()
	}
}

// refusalLog logs refused connections at most once a second, with a count of
// those it left out, so that a flood of strangers cannot flood the log.
type refusalLog struct {
	log     *zap.Logger
	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (r *refusalLog) note(why string, c net.Conn, err error) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < time.Second {
		r.skipped++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped
	r.last, r.skipped = now, 0
	r.mu.Unlock()
	fields := []zap.Field{zap.String("why", why), zap.Stringer("remote", c.RemoteAddr()), zap.Int("more_refused_since_last_line", skipped)}
	if hc, ok := c.(*helloConn); ok {
		fields = append(fields, zap.String("run", hc.hello.Run), zap.Uint64("generation", hc.hello.Generation), zap.Uint32("from", hc.hello.From))
	}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	r.log.Warn("collective connection refused", fields...)
}
