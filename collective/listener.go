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
type Listener struct {
	ln  net.Listener
	log *zap.Logger

	mu      sync.Mutex
	waiting map[connKey]chan net.Conn
	pending int
	closed  bool
}

const (
	// maxPendingConns bounds connections that said hello but were not yet claimed by a Join.
	maxPendingConns = 256
	// unclaimedTimeout is how long a connection waits for its Join before it is closed.
	unclaimedTimeout = 60 * time.Second
)

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
	l := &Listener{ln: ln, log: log, waiting: map[connKey]chan net.Conn{}}
	go l.acceptLoop()
	return l
}

// Addr is the address the listener is bound to, for the gang's peer list.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting; groups already joined keep their connections.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	for k, ch := range l.waiting {
		drain(ch)
		delete(l.waiting, k)
	}
	l.mu.Unlock()
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

// route reads a connection's hello and queues it for the Join of the rank it names.
func (l *Listener) route(conn net.Conn) {
	conn.SetReadDeadline(time.Now().Add(handshakeTimeout))
	h, err := readHello(conn)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		l.log.Warn("collective connection refused", zap.Stringer("remote", conn.RemoteAddr()), zap.Error(err))
		conn.Close()
		return
	}
	l.mu.Lock()
	if l.closed || l.pending >= maxPendingConns {
		l.mu.Unlock()
		l.log.Warn("collective connection refused: listener closed or too many unclaimed connections",
			zap.Stringer("remote", conn.RemoteAddr()))
		conn.Close()
		return
	}
	ch := l.queueLocked(h.key())
	select {
	case ch <- &helloConn{Conn: conn, hello: h}:
		l.pending++
	default:
		l.mu.Unlock()
		l.log.Warn("collective connection refused: too many connections for one rank",
			zap.Stringer("remote", conn.RemoteAddr()), zap.String("run", h.Run), zap.Uint32("from", h.From))
		conn.Close()
		return
	}
	l.mu.Unlock()
	time.AfterFunc(unclaimedTimeout, func() { l.expire(h.key()) })
}

// helloConn is a connection whose hello has been read by the listener.
type helloConn struct {
	net.Conn
	hello hello
}

func (l *Listener) queueLocked(k connKey) chan net.Conn {
	ch, ok := l.waiting[k]
	if !ok {
		ch = make(chan net.Conn, 8)
		l.waiting[k] = ch
	}
	return ch
}

// expire closes connections for k that no Join claimed in time.
func (l *Listener) expire(k connKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.waiting[k]
	if !ok {
		return
	}
	for {
		select {
		case c := <-ch:
			l.pending--
			l.log.Warn("collective connection closed: no rank claimed it",
				zap.String("run", k.run), zap.Uint64("generation", k.gen), zap.Uint32("from", k.from), zap.Uint32("to", k.to))
			c.Close()
		default:
			return
		}
	}
}

// accept waits for an authenticated connection from rank `from` for the given
// key, verifying each candidate with the secret; impostors are logged and closed.
func (l *Listener) accept(ctx context.Context, k connKey, secret []byte) (net.Conn, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("collective: listener is closed")
	}
	ch := l.queueLocked(k)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.waiting[k] == ch && len(ch) == 0 {
			delete(l.waiting, k)
		}
		l.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case c := <-ch:
			l.mu.Lock()
			l.pending--
			l.mu.Unlock()
			hc := c.(*helloConn)
			if err := acceptHandshake(hc.Conn, secret, hc.hello); err != nil {
				l.log.Warn("collective connection refused",
					zap.String("run", k.run), zap.Uint64("generation", k.gen), zap.Uint32("from", k.from),
					zap.Stringer("remote", hc.RemoteAddr()), zap.Error(err))
				hc.Close()
				continue
			}
			return hc.Conn, nil
		}
	}
}

func drain(ch chan net.Conn) {
	for {
		select {
		case c := <-ch:
			c.Close()
		default:
			return
		}
	}
}
