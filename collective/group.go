package collective

import (
	"bufio"
	"context"
	"crypto/ecdh"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Gang names one attempt of a run's ranks to work together.
type Gang struct {
	// Run identifies the training run; connections of other runs are refused.
	Run string
	// Generation increases every time the run forms a new gang, so a rank of a
	// failed gang can never be connected into the next one.
	Generation uint64
	// Peers holds the collective listener address of every rank, indexed by rank.
	Peers []string
	// PublicKeys holds every rank's X25519 public key, indexed by rank, when
	// the ranks authenticate with keys of their own (Options.Identity).
	PublicKeys [][]byte
}

// Options tune a group. The zero value of each field picks its default.
type Options struct {
	// Identity is this rank's X25519 private key; its public key is
	// Gang.PublicKeys[rank]. Each pair of neighbours then authenticates with a
	// key derived from their Diffie-Hellman secret, so no shared secret needs
	// to travel: the public keys may be read by anyone. Secret is then unused.
	Identity *ecdh.PrivateKey
	// Secret authenticates every connection of the run when there is no
	// Identity; at least 16 bytes, the same on every rank.
	Secret []byte
	// StallTimeout is how long a rank waits without any frame (data or keepalive)
	// from its left neighbour before it declares that neighbour stalled (after
	// between 3/4 and all of it). Default 5s.
	StallTimeout time.Duration
	// KeepaliveInterval is how often an idle rank tells its right neighbour it is alive.
	// Default StallTimeout/5.
	KeepaliveInterval time.Duration
	// ChunkBytes is the pipelining unit: segments are cut into chunks of this size so that
	// sending, receiving and summing overlap. Default 1 MiB.
	ChunkBytes int
	// SpinWindow is how long a rank in a small operation (at most SpinMaxBytes)
	// busy-polls for its left neighbour's next frame before it sleeps. Waking a
	// sleeping process costs more than a small step; on large operations the
	// CPU is better left to the peers. Default 200µs; negative never spins.
	SpinWindow time.Duration
	// SpinMaxBytes is the largest operation that spins. Default 256 KiB.
	SpinMaxBytes int
	// GatherBytes enables the small all-reduce: while a rank would receive at
	// most this many bytes by gathering every other rank's whole buffer
	// (bytes × (world-1)), AllReduce gathers them in world-1 ring steps and
	// every rank sums the buffers, instead of the 2(world-1) steps of
	// reduce-scatter and all-gather (MPI's small-message trade). The sums are
	// the ring's, bit for bit: each segment is added in the ring's order.
	// Off by default (0 or negative): every rank must use the same value, and
	// ranks that disagree (a gang with ranks of an earlier release, which
	// never gathers) fail the operation with a protocol error. Gather only
	// small buffers: 4 KiB takes about half the ring's time, 64 KiB with 2
	// ranks several times longer (BENCHMARKS.md).
	GatherBytes int
	// RefusedTimeout is how long the right neighbour's address may refuse
	// connections (nothing listens there) before Join gives up on it with a
	// *PeerError naming it. Zero waits until ctx ends: a listener may still be
	// starting, as a rank process's does. Set it where every peer's listener
	// was up before the gang formed (a worker listens before it grants a
	// slot): there a refusal means the peer's process is gone, and waiting on
	// would leave the gang to find out at a heartbeat timeout.
	RefusedTimeout time.Duration
	// Transport is TransportAuto (shared memory with neighbours on the same
	// host, TCP otherwise), TransportTCP or TransportSameIP.
	Transport string
	// Progress says who moves an operation started by StartAllReduce:
	// ProgressAuto (default), ProgressCaller or ProgressNever (driven.go).
	Progress string
	// Logger receives one line per connection refused and per group failure. Default: none.
	Logger *zap.Logger

	// hostCores is the cores Join counts on this host; 0: runtime.NumCPU().
	// Tests set it to take the paths of a host with more ranks than cores,
	// or fewer, whatever this machine has.
	hostCores int
}

const (
	minSecretLen       = 16
	defaultStall       = 5 * time.Second
	defaultChunkBytes  = 1 << 20
	abortWriteTimeout  = 250 * time.Millisecond
	culpritGracePeriod = 100 * time.Millisecond
)

func (o Options) withDefaults() Options {
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStall
	}
	if o.KeepaliveInterval <= 0 {
		o.KeepaliveInterval = o.StallTimeout / 5
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = defaultChunkBytes
	}
	o.ChunkBytes &^= 3 // whole float32s
	if o.ChunkBytes == 0 {
		o.ChunkBytes = 4
	}
	if o.SpinWindow == 0 {
		o.SpinWindow = 200 * time.Microsecond
	}
	if o.SpinMaxBytes == 0 {
		o.SpinMaxBytes = 256 << 10
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// PeerError is the error every rank returns when the group fails: Rank names
// the peer that died, stalled, refused us or aborted, as seen by Reporter.
type PeerError struct {
	Rank     int    // the culprit; -1 when no peer is to blame (the caller cancelled)
	Addr     string // the culprit's listener address, when known
	Reporter int    // the rank that first detected the failure
	Reason   string
}

func (e *PeerError) Error() string {
	if e.Rank < 0 {
		return fmt.Sprintf("collective: group aborted by rank %d: %s", e.Reporter, e.Reason)
	}
	return fmt.Sprintf("collective: rank %d (%s) failed, detected by rank %d: %s", e.Rank, e.Addr, e.Reporter, e.Reason)
}

// closedReason is the abort message of a rank that closes its group.
const closedReason = "rank closed the group"

// ErrClosed is returned by operations on a group closed by its own rank.
var ErrClosed = errors.New("collective: group closed")

// Group is one rank's membership in a gang. Operations must be called in the
// same order with the same lengths on every rank; one at a time per group.
type Group struct {
	gang        Gang
	rank, world int
	left, right int // neighbour ranks
	opts        Options
	log         *zap.Logger
	// dialSecret authenticates the connection to the right neighbour,
	// acceptSecret the one from the left.
	dialSecret, acceptSecret []byte

	leftConn, rightConn net.Conn // data flows left -> us -> right
	leftReader          *bufio.Reader
	// leftMu is the turn to read the left link (serveLeft): a small
	// operation's own goroutine, or readLeft. leftRd is under it.
	leftMu              sync.Mutex
	leftRd              leftReading
	wantLeft            atomic.Bool   // an operation waits for readLeft to give the link up
	leftUsed            atomic.Int64  // unix nanos when an operation last gave the link up
	sendRing, recvRing  *shmRing      // shared memory with the right / left neighbour, if on this host
	shmSent, shmDrained uint64        // chunks put in sendRing; chunks taken from recvRing
	inOp                atomic.Bool   // an operation is in progress: the left reader may spin
	spin                time.Duration // how long a shared-memory link polls its ring before it sleeps
	yield               *coreYielder  // more ranks than cores here: poll by yielding the core
	leftClosed          atomic.Bool   // the left neighbour closed its group gracefully (shared-memory links)
	rightClosed         atomic.Bool   // the right neighbour closed its group gracefully
	// nbLeft and nbRight are the links read and written without blocking by
	// an operation's progress loop, woken by waker when the group fails
	// (progress.go); nil where the platform has none.
	nbLeft, nbRight nbLink
	waker           *progressWaker
	writeMu         sync.Mutex
	frameBuf        []byte // header and small payload, under writeMu
	leftWriteMu     sync.Mutex
	lastWrite       atomic.Int64 // unix nanos of the last frame to the right

	// Counted for tests: operations that took the left link from readLeft,
	// data frames read before their operation began, and operations run by
	// a progress loop.
	leftTaken, leftEarly, progressOps atomic.Int64

	opMu    sync.Mutex
	seq     uint32
	driven  bool        // StartAllReduce leaves its operations to the caller (driven.go)
	started []*drivenOp // operations started and not yet complete, oldest first
	jobs    chan *recvJob
	scratch []float32
	// gathered holds the other ranks' buffers of a small all-reduce and the
	// sum being made (world × its length); plans the plans made, reused
	// while the caller passes the same buffers (at most maxPlans of them).
	gathered []float32
	plans    map[planKey]plan

	failOnce   sync.Once
	closeRings sync.Once
	done       chan struct{}
	err        error
	wg         sync.WaitGroup
}

// Join makes this process rank `rank` of the gang: it dials the right
// neighbour, accepts the left one through ln, and authenticates both. It
// returns when both connections are up or ctx ends.
func Join(ctx context.Context, ln *Listener, gang Gang, rank int, opts Options) (*Group, error) {
	opts = opts.withDefaults()
	world := len(gang.Peers)
	switch {
	case world == 0:
		return nil, errors.New("collective: gang.Peers is empty; want one listener address per rank")
	case rank < 0 || rank >= world:
		return nil, fmt.Errorf("collective: rank %d out of range; want 0..%d for %d peers", rank, world-1, world)
	case gang.Run == "" || len(gang.Run) > maxRunLen:
		return nil, fmt.Errorf("collective: gang.Run %q; want 1..%d bytes", gang.Run, maxRunLen)
	case opts.Identity == nil && len(opts.Secret) < minSecretLen:
		return nil, fmt.Errorf("collective: options.Secret has %d bytes; want at least %d (or an options.Identity)", len(opts.Secret), minSecretLen)
	case world > 1 && ln == nil:
		return nil, errors.New("collective: a Listener is required for more than one rank")
	case opts.Transport != TransportAuto && opts.Transport != TransportTCP && opts.Transport != TransportSameIP:
		return nil, fmt.Errorf("collective: options.Transport %q; want %q (automatic), %q or %q", opts.Transport, TransportAuto, TransportTCP, TransportSameIP)
	case opts.Progress != ProgressAuto && opts.Progress != ProgressCaller && opts.Progress != ProgressNever:
		return nil, fmt.Errorf("collective: options.Progress %q; want %q (automatic), %q or %q", opts.Progress, ProgressAuto, ProgressCaller, ProgressNever)
	}
	g := &Group{
		gang: gang, rank: rank, world: world,
		left: (rank + world - 1) % world, right: (rank + 1) % world,
		opts: opts, log: opts.Logger.With(zap.String("run", gang.Run), zap.Uint64("generation", gang.Generation), zap.Int("rank", rank)),
		jobs: make(chan *recvJob, 1),
		done: make(chan struct{}),
	}
	if world == 1 {
		return g, nil
	}
	var err error
	if g.dialSecret, g.acceptSecret, err = linkSecrets(gang, rank, g.left, g.right, opts); err != nil {
		return nil, err
	}
	type result struct {
		conn net.Conn
		err  error
	}
	dialed, accepted := make(chan result, 1), make(chan result, 1)
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, err := g.dialRight(jctx)
		dialed <- result{c, err}
	}()
	go func() {
		k := connKey{run: gang.Run, gen: gang.Generation, from: uint32(g.left), to: uint32(rank), world: uint32(world)}
		c, err := ln.accept(jctx, k, g.acceptSecret)
		if err != nil {
			err = fmt.Errorf("collective: rank %d: waiting for rank %d (%s) to connect: %w", rank, g.left, gang.Peers[g.left], err)
		}
		accepted <- result{c, err}
	}()
	var firstErr error
	for range 2 {
		select {
		case r := <-dialed:
			g.rightConn = r.conn
			if r.err != nil && firstErr == nil {
				firstErr = r.err
				cancel()
			}
		case r := <-accepted:
			g.leftConn = r.conn
			if r.err != nil && firstErr == nil {
				firstErr = r.err
				cancel()
			}
		}
	}
	if firstErr != nil {
		for _, c := range []net.Conn{g.leftConn, g.rightConn} {
			if c != nil {
				c.Close()
			}
		}
		return nil, firstErr
	}
	if err := g.negotiateShm(ctx); err != nil {
		g.leftConn.Close()
		g.rightConn.Close()
		return nil, fmt.Errorf("collective: rank %d: %w", rank, err)
	}
	spin := opts.SpinWindow
	cores := opts.hostCores
	if cores <= 0 {
		cores = runtime.NumCPU()
	}
	if ranksOnHost(gang.Peers, rank) > cores {
		// More ranks than cores here: a polling rank would take the core from the
		// rank it waits for (measured: 4 ranks on 2 cores, 3x slower with polling).
		// A shared-memory link polls its ring by giving the core up (sched_yield)
		// between looks instead.
		spin = 0
		g.yield = new(coreYielder)
	}
	g.spin = opts.SpinWindow
	g.driven = callerDriven(opts.Progress, g.sendRing != nil && g.recvRing != nil, ranksOnHost(gang.Peers, rank), cores)
	var left io.Reader = newSpinReader(g.leftConn, spin, &g.inOp)
	if g.recvRing == nil && g.yield != nil {
		// Data comes over TCP to a host with more ranks than cores: read it
		// outside the runtime's poller, where an arrival wakes one thread, not
		// two, and look for it by yielding the core while an operation is in
		// progress (fdconn_linux.go). Where every rank has a core, the
		// poller does as well idle and better under load (BENCHMARKS.md).
		c, err := newFDConn(g.leftConn, pollPolicy{active: &g.inOp, window: opts.SpinWindow, yield: g.yield})
		if err != nil {
			g.log.Info("reading the left link through the runtime's poller", zap.Error(err))
		} else if c != g.leftConn {
			g.leftConn, left = c, c
		}
	}
	g.leftReader = bufio.NewReaderSize(left, 64<<10)
	if w, err := newProgressWaker(); err == nil {
		g.nbLeft, g.nbRight = nbLinkOf(g.leftConn), nbLinkOf(g.rightConn)
		if g.nbLeft != nil && g.nbRight != nil {
			g.waker = w
		} else {
			g.nbLeft, g.nbRight = nil, nil
			w.close()
		}
	}
	g.leftRd.heard = time.Now()
	g.lastWrite.Store(time.Now().UnixNano())
	g.wg.Add(3)
	go g.readLeft()
	go g.readRight()
	go g.keepalive()
	return g, nil
}

// ranksOnHost counts the gang's ranks whose listener is on the same host as rank's.
func ranksOnHost(peers []string, rank int) int {
	host, _, err := net.SplitHostPort(peers[rank])
	if err != nil {
		return 1
	}
	n := 0
	for _, p := range peers {
		if h, _, err := net.SplitHostPort(p); err == nil && h == host {
			n++
		}
	}
	return n
}

// dialRight connects to the right neighbour, retrying until its listener is up.
func (g *Group) dialRight(ctx context.Context) (net.Conn, error) {
	addr := g.gang.Peers[g.right]
	h := hello{Run: g.gang.Run, Generation: g.gang.Generation, From: uint32(g.rank), To: uint32(g.right), World: uint32(g.world)}
	backoff := 20 * time.Millisecond
	var d net.Dialer
	var refusedSince time.Time // when the address began refusing, if it does
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		switch {
		case err == nil || !errors.Is(err, syscall.ECONNREFUSED):
			refusedSince = time.Time{}
		case refusedSince.IsZero():
			refusedSince = time.Now()
		case g.opts.RefusedTimeout > 0 && time.Since(refusedSince) >= g.opts.RefusedTimeout:
			return nil, &PeerError{Rank: g.right, Addr: addr, Reporter: g.rank,
				Reason: fmt.Sprintf("its address refused connections for %v: nothing listens there (its worker is gone)", time.Since(refusedSince).Round(time.Millisecond))}
		}
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			err = dialHandshake(ctx, conn, g.dialSecret, h)
			if err == nil {
				return conn, nil
			}
			conn.Close()
			if errors.Is(err, errAuth) {
				return nil, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w", g.rank, g.right, addr, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w (last error: %v)", g.rank, g.right, addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
		if g.opts.RefusedTimeout > 0 && !refusedSince.IsZero() {
			backoff = min(backoff, g.opts.RefusedTimeout/4) // look again within the timeout
		}
	}
}

// Rank is this member's rank; World the gang's size.
func (g *Group) Rank() int  { return g.rank }
func (g *Group) World() int { return g.world }

// Err reports why the group failed, or nil while it is healthy.
func (g *Group) Err() error {
	select {
	case <-g.done:
		return g.err
	default:
		return nil
	}
}

// Close leaves the group; neighbours still in an operation get a PeerError naming this rank.
func (g *Group) Close() error {
	g.fail(ErrClosed, &PeerError{Rank: g.rank, Reporter: g.rank, Reason: closedReason})
	g.wg.Wait()
	// An operation in progress returns now that the group failed; it may
	// still be reading a ring until it does.
	g.opMu.Lock()
	defer g.opMu.Unlock()
	g.dropStarted()
	g.closeRings.Do(func() {
		if g.waker != nil {
			g.waker.close()
		}
		if g.sendRing != nil {
			g.sendRing.close()
		}
		if g.recvRing != nil {
			g.recvRing.close()
		}
	})
	return nil
}

// Frames. Header: type, op kind, 2 reserved bytes, seq, payload length, aux.
// Abort frames carry the reporter in seq, the culprit+1 in aux, and op 1 when
// the rank closed its group gracefully rather than failing.
const (
	frameData      = 1
	frameKeepalive = 2
	frameAbort     = 3
	headerLen      = 16
	maxAbortMsg    = 1024
)

const (
	opAllReduce = 1
	opBroadcast = 2
	opGatherSum = 3 // AllReduce of a small buffer: gather, then sum in the ring's order
)

type header struct {
	typ, op, flags byte
	seq            uint32
	length         uint32
	aux            uint32
}

func (h header) put(b []byte) {
	b[0], b[1], b[2], b[3] = h.typ, h.op, h.flags, 0
	binary.LittleEndian.PutUint32(b[4:], h.seq)
	binary.LittleEndian.PutUint32(b[8:], h.length)
	binary.LittleEndian.PutUint32(b[12:], h.aux)
}

func parseHeader(b []byte) header {
	return header{typ: b[0], op: b[1], flags: b[2], seq: binary.LittleEndian.Uint32(b[4:]), length: binary.LittleEndian.Uint32(b[8:]), aux: binary.LittleEndian.Uint32(b[12:])}
}

// writeRight sends one frame to the right neighbour.
func (g *Group) writeRight(h header, payload []byte) error {
	var hb [headerLen]byte
	h.put(hb[:])
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	var err error
	if len(payload) <= smallFrame {
		// One write(2) through net.Conn: one syscall, and the runtime records the
		// happens-before edge of network I/O, which writev does not.
		g.frameBuf = append(append(g.frameBuf[:0], hb[:]...), payload...)
		_, err = g.rightConn.Write(g.frameBuf)
	} else {
		bufs := net.Buffers{hb[:], payload}
		_, err = bufs.WriteTo(g.rightConn)
	}
	g.lastWrite.Store(time.Now().UnixNano())
	return err
}

// smallFrame is the largest payload copied next to its header for a single write.
const smallFrame = 64 << 10

func (g *Group) keepalive() {
	defer g.wg.Done()
	t := time.NewTicker(g.opts.KeepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			if time.Since(time.Unix(0, g.lastWrite.Load())) < g.opts.KeepaliveInterval/2 {
				continue
			}
			if g.rightClosed.Load() {
				return // nobody to keep informed
			}
			if err := g.writeRight(header{typ: frameKeepalive}, nil); err != nil {
				time.Sleep(culpritGracePeriod) // a graceful close may be what broke the pipe
				if !g.rightClosed.Load() {
					g.failPeer(g.right, "sending keepalive", err)
				}
				return
			}
		}
	}
}

// readRight watches the reverse direction of the right connection, which
// carries only abort frames: a bare EOF there means the right neighbour died.
func (g *Group) readRight() {
	defer g.wg.Done()
	var hb [headerLen]byte
	for {
		if _, err := io.ReadFull(g.rightConn, hb[:]); err != nil {
			g.blame(g.right, fmt.Sprintf("connection lost: %v", err))
			return
		}
		h := parseHeader(hb[:])
		if h.typ != frameAbort {
			g.failPeer(g.right, "protocol error", fmt.Errorf("unexpected frame type %d on the reverse direction", h.typ))
			return
		}
		if h.op == 1 {
			// The right neighbour closed after finishing its operations: what it
			// sent us is still arriving in order on the left connection, and our
			// next send to it will fail on its own. Nothing to abort yet.
			g.rightClosed.Store(true)
			return
		}
		g.readAbort(g.rightConn, h)
		return
	}
}

// readAbort reads an abort frame's message and fails the group with the culprit it names.
func (g *Group) readAbort(conn io.Reader, h header) {
	msg := make([]byte, min(h.length, maxAbortMsg))
	io.ReadFull(conn, msg)
	culprit := int(h.aux) - 1
	pe := &PeerError{Rank: culprit, Addr: g.addrOf(culprit), Reporter: int(h.seq), Reason: string(msg)}
	g.fail(pe, pe)
}

func (g *Group) addrOf(rank int) string {
	if rank >= 0 && rank < len(g.gang.Peers) {
		return g.gang.Peers[rank]
	}
	return ""
}

// failPeer fails the group blaming a neighbour, unless that neighbour's own
// abort frame (naming the real culprit) arrives within a short grace period.
func (g *Group) failPeer(peer int, what string, err error) {
	select {
	case <-g.done:
		return
	default:
	}
	if peer == g.right {
		// The right neighbour may have aborted on purpose: its abort frame is on the way.
		select {
		case <-g.done:
			return
		case <-time.After(culpritGracePeriod):
		}
	}
	g.blame(peer, fmt.Sprintf("%s: %v", what, err))
}

// blame fails the group naming peer as the culprit.
func (g *Group) blame(peer int, reason string) {
	pe := &PeerError{Rank: peer, Addr: g.addrOf(peer), Reporter: g.rank, Reason: reason}
	g.fail(pe, pe)
}

// fail records the group's first error, tells both neighbours whom to blame
// (pe travels in the abort frame), and closes the connections so that every
// blocked call returns. local is what this rank's callers get.
func (g *Group) fail(local error, pe *PeerError) {
	g.failOnce.Do(func() {
		g.err = local
		close(g.done)
		if g.world == 1 {
			return
		}
		if g.waker != nil {
			g.waker.wake() // a progress loop waiting in poll(2)
		}
		g.wakeRings()
		if local != ErrClosed && pe.Reason != closedReason {
			g.log.Warn("collective group failed", zap.Int("culprit", pe.Rank), zap.Int("reporter", pe.Reporter), zap.String("reason", pe.Reason))
		}
		reason := pe.Reason
		if len(reason) > maxAbortMsg {
			reason = reason[:maxAbortMsg]
		}
		frame := make([]byte, headerLen+len(reason))
		var graceful byte
		if local == ErrClosed {
			graceful = 1
		}
		header{typ: frameAbort, op: graceful, seq: uint32(pe.Reporter), length: uint32(len(reason)), aux: uint32(pe.Rank + 1)}.put(frame)
		copy(frame[headerLen:], reason)
		var wg sync.WaitGroup
		for _, side := range []struct {
			conn net.Conn
			mu   *sync.Mutex
		}{{g.rightConn, &g.writeMu}, {g.leftConn, &g.leftWriteMu}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Unblock a writer stuck on a peer that does not read, then send the abort.
				side.conn.SetWriteDeadline(time.Now().Add(abortWriteTimeout))
				side.mu.Lock()
				side.conn.Write(frame)
				side.mu.Unlock()
			}()
		}
		wg.Wait()
		g.leftConn.Close()
		g.rightConn.Close()
	})
}

// recvJob is the receiving half of one operation: served by the operation's
// own goroutine for a small operation over TCP, by readLeft otherwise.
type recvJob struct {
	seq      uint32
	op       byte
	items    []recvItem
	tokens   chan struct{} // one per item received, for the sender to forward it
	finished chan struct{}
	// forwards, for a small operation over TCP, are the sends that wait for a
	// receipt: the goroutine that reads makes them as the data arrives
	// (forwardFrom), instead of waking another goroutine for each (see run).
	forwards  []sendItem
	forwarded int // forwards sent
}

type recvItem struct {
	dst []float32
	add bool // sum into dst (reduce-scatter) or overwrite it (all-gather, broadcast)
}

// leftReading is where reading the left link stands between the goroutines
// that take turns at it, under leftMu (see serveLeft).
type leftReading struct {
	hdr  [headerLen]byte
	hdrN int // bytes of hdr read so far: a read interrupted in a header goes on from there
	// pending: hdr is a data frame's, read before its operation began.
	pending bool
	// ended: the left neighbour closed its group gracefully between
	// operations; the next operation that expects data from it fails.
	ended bool
	// heard is when the last frame's header was read: silence is counted
	// from it, whoever reads (serveLeft's arm). deadline is the read
	// deadline set; kicked, that a reader was interrupted (takeLeft) and
	// the deadline must be set again.
	heard, deadline time.Time
	kicked          bool
}

// leftIdleGap is how long the left link may go unread between operations
// before readLeft reads it (keepalives, aborts, a stall). Operations read it
// themselves, so while they come closer together than this, readLeft only
// wakes once a gap to find that one ran. Failures are still noticed at
// once: an operation reads the link, and an abort also reaches every rank
// leftwards through the other direction of its right link (readRight).
const leftIdleGap = 20 * time.Millisecond

// leftEnd is why serveLeft returned.
type leftEnd int

const (
	leftJobDone leftEnd = iota // the job's last frame is in
	leftWaiting                // no job: a data frame arrived before its operation, or the neighbour closed
	leftYielded                // no job: an operation wants the link (takeLeft)
	leftFailed                 // the group failed
)

// serveLeft reads frames from the left neighbour until job's last frame is
// in, or, with no job, until a data frame arrives (its header is kept for
// its operation) or an operation takes the link. It handles keepalives,
// aborts and silence (StallTimeout) on the way. The caller holds leftMu.
func (g *Group) serveLeft(job *recvJob) leftEnd {
	l := &g.leftRd
	if job == nil && l.pending {
		return leftWaiting // until its operation takes it
	}
	if l.ended {
		if job == nil {
			return leftWaiting
		}
		g.blame(g.left, closedReason+" before sending this operation's data")
		return leftFailed
	}
	next := 0
	for {
		if !l.pending {
			g.armLeft()
			if job == nil && g.wantLeft.Load() {
				return leftYielded
			}
			n, err := io.ReadFull(g.leftReader, l.hdr[l.hdrN:])
			l.hdrN += n
			if err != nil {
				if job == nil && g.wantLeft.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
					return leftYielded
				}
				g.failLeft(err)
				return leftFailed
			}
			l.hdrN, l.heard = 0, time.Now()
		}
		h := parseHeader(l.hdr[:])
		switch h.typ {
		case frameKeepalive:
			continue
		case frameAbort:
			if h.op == 1 && job == nil {
				// The left neighbour finished and closed. That fails nothing until
				// this rank expects data from it again (a pending or later operation).
				io.CopyN(io.Discard, g.leftReader, int64(h.length))
				l.ended = true
				return leftWaiting
			}
			g.readAbort(g.leftReader, h)
			return leftFailed
		case frameData:
		default:
			g.failPeer(g.left, "protocol error", fmt.Errorf("unknown frame type %d", h.typ))
			return leftFailed
		}
		if job == nil {
			l.pending = true
			g.leftEarly.Add(1)
			return leftWaiting
		}
		l.pending = false
		it := job.items[next]
		if h.seq != job.seq || h.op != job.op || int(h.length) != 4*len(it.dst) {
			g.failPeer(g.left, "protocol error", fmt.Errorf(
				"received operation #%d kind %d with %d bytes, expected operation #%d kind %d with %d bytes: ranks called collectives in different orders or with different lengths",
				h.seq, h.op, h.length, job.seq, job.op, 4*len(it.dst)))
			return leftFailed
		}
		dst := it.dst
		if it.add {
			dst = g.scratch[:len(it.dst)]
		}
		g.armLeft()
		if _, err := io.ReadFull(g.leftReader, asBytes(dst)); err != nil {
			g.failLeft(err)
			return leftFailed
		}
		if it.add {
			addInto(it.dst, dst)
		}
		next++
		if job.tokens != nil {
			job.tokens <- struct{}{}
		} else if err := g.forwardFrom(job, next); err != nil {
			g.failPeer(g.right, "sending", err)
			return leftFailed
		}
		if next == len(job.items) {
			return leftJobDone
		}
	}
}

// armLeft sets the left link's read deadline, StallTimeout after the last
// frame was heard, moved on at most every quarter window (a timer update
// per frame costs microseconds): silence is detected after 3/4 to 1
// StallTimeout. It counts from the last frame, not from when a reader
// began: operations and readLeft take turns, and a turn must not restart
// the count. A link left unread longer than that gets stall/8 from now: a
// read whose deadline has passed fails before it looks at what already
// arrived. The caller reads the link (holds leftMu, or is its only reader).
func (g *Group) armLeft() {
	l, stall := &g.leftRd, g.opts.StallTimeout
	now := time.Now()
	want := l.heard.Add(stall)
	if least := now.Add(stall / 8); want.Before(least) {
		want = least
	}
	if l.kicked || want.Sub(l.deadline) > stall/4 || l.deadline.Sub(now) < stall/8 {
		l.deadline, l.kicked = want, false
		g.leftConn.SetReadDeadline(want)
	}
}

// takeLeft gives the calling operation the left link (leftMu), interrupting
// readLeft if it is reading between operations: that costs a wake, paid
// only by an operation that follows a gap of leftIdleGap or more.
func (g *Group) takeLeft() {
	if g.leftMu.TryLock() {
		return
	}
	g.leftTaken.Add(1)
	g.wantLeft.Store(true)
	// serveLeft sets its deadline before it looks at wantLeft: either it
	// sees wantLeft, or this deadline ends its read.
	g.leftConn.SetReadDeadline(time.Unix(1, 0))
	g.leftMu.Lock()
	g.wantLeft.Store(false)
	g.leftRd.kicked = true
}

// releaseLeft ends an operation's turn at the left link.
func (g *Group) releaseLeft() {
	g.leftUsed.Store(time.Now().UnixNano())
	g.leftMu.Unlock()
}

// readLeft serves the left link for the group's lifetime: the receiving
// half of the operations that hand it theirs (g.jobs), and, once no
// operation has read the link for leftIdleGap, the frames that come between
// operations. Silence for longer than StallTimeout means the left neighbour
// has stalled.
func (g *Group) readLeft() {
	defer g.wg.Done()
	if g.recvRing != nil {
		g.readLeftBesideRing()
		return
	}
	idle := time.NewTimer(leftIdleGap)
	defer idle.Stop()
	for {
		select {
		case job := <-g.jobs: // its operation took leftMu for us (run)
			end := g.serveLeft(job)
			g.releaseLeft()
			if end == leftFailed {
				return
			}
			// Done: stop looking for frames (fdConn), and let the operation's
			// goroutine, which this wakes, have this thread's P at once rather
			// than wait for another thread to take it.
			g.inOp.Store(false)
			close(job.finished)
			runtime.Gosched()
		case <-idle.C:
			if since := time.Since(time.Unix(0, g.leftUsed.Load())); since < leftIdleGap {
				idle.Reset(leftIdleGap - since)
				continue
			}
			if g.leftMu.TryLock() {
				end := g.serveLeft(nil)
				g.leftMu.Unlock()
				if end == leftFailed {
					return
				}
			}
			idle.Reset(leftIdleGap)
		case <-g.done:
			return
		}
	}
}

// readLeftBesideRing reads the left TCP link of a shared-memory link, which
// carries keepalives and aborts only (the data crosses the ring).
func (g *Group) readLeftBesideRing() {
	var hb [headerLen]byte
	for {
		g.armLeft()
		if _, err := io.ReadFull(g.leftReader, hb[:]); err != nil {
			g.failLeft(err)
			return
		}
		g.leftRd.heard = time.Now()
		h := parseHeader(hb[:])
		switch h.typ {
		case frameKeepalive:
			continue
		case frameAbort:
			if h.op == 1 {
				// The left neighbour finished and closed: the operation that
				// expects more data from it fails (shmReceiver.await).
				g.leftClosed.Store(true)
				futexWake(g.recvRing.published())
				return
			}
			g.readAbort(g.leftReader, h)
		case frameData:
			g.failPeer(g.left, "protocol error", errors.New("a data frame over TCP on a shared-memory link"))
		default:
			g.failPeer(g.left, "protocol error", fmt.Errorf("unknown frame type %d", h.typ))
		}
		return
	}
}

// forwardFrom sends the forwards of a small operation that the items
// received so far allow: each forward waits for one receipt, as run's sends
// wait for a token.
func (g *Group) forwardFrom(job *recvJob, received int) error {
	for job.forwarded < len(job.forwards) && job.forwarded < received {
		s := job.forwards[job.forwarded]
		h := header{typ: frameData, op: job.op, seq: job.seq, length: uint32(4 * len(s.src))}
		if err := g.writeRight(h, asBytes(s.src)); err != nil {
			return err
		}
		job.forwarded++
	}
	return nil
}

func (g *Group) failLeft(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		g.failPeer(g.left, "stalled", fmt.Errorf("no data or keepalive for %v", g.opts.StallTimeout))
		return
	}
	g.failPeer(g.left, "connection lost", err)
}

// closedChan is the finished channel of an operation that receives nothing.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sendItem is one chunk this rank sends to the right; afterToken means it
// is the chunk received from the left one step earlier and must wait for it.
type sendItem struct {
	src        []float32
	afterToken bool
}

// run executes one operation, aborting the group if ctx ends first. A small
// operation over TCP reads and forwards in the calling goroutine; a larger
// one hands its receiving half to readLeft and sends here; one over shared
// memory does both here (shmlink.go).
func (g *Group) run(ctx context.Context, op byte, bytes int, sends []sendItem, recvs []recvItem) error {
	if err := g.Err(); err != nil {
		return err
	}
	g.seq++
	job := &recvJob{seq: g.seq, op: op, items: recvs}
	var shm *shmReceiver // receives from shared memory, in this goroutine (shmlink.go)
	switch {
	case len(recvs) == 0:
		job.finished = closedChan
	case g.recvRing != nil: // no channels: nothing to hand over to readLeft
		shm = &shmReceiver{g: g, job: job}
		if bytes <= g.opts.SpinMaxBytes {
			shm.spin = g.spin
		}
	default:
		if bytes <= g.opts.SpinMaxBytes {
			g.inOp.Store(true)
			defer g.inOp.Store(false)
		}
	}
	stop := context.AfterFunc(ctx, func() {
		reason := fmt.Sprintf("operation #%d cancelled: %v", job.seq, context.Cause(ctx))
		pe := &PeerError{Rank: -1, Reporter: g.rank, Reason: reason}
		g.fail(pe, pe)
	})
	defer stop()
	if shm == nil && len(recvs) > 0 {
		if first, ok := g.forwardsInline(sends, len(recvs)); ok {
			// A small operation over TCP: send what needs no receipt, then read
			// the rest in this goroutine and forward it as it arrives. Each ring
			// step then costs one wake of this process, and the operation none
			// of another goroutine (which, with GOMAXPROCS > 1, woke another
			// thread: on a host with more ranks than cores, a core's worth).
			for _, s := range sends[:first] {
				h := header{typ: frameData, op: op, seq: job.seq, length: uint32(4 * len(s.src))}
				if err := g.writeRight(h, asBytes(s.src)); err != nil {
					g.failPeer(g.right, "sending", err)
					<-g.done
					return g.err
				}
			}
			job.forwards = sends[first:]
			g.takeLeft()
			end := g.serveLeft(job)
			g.releaseLeft()
			if end != leftJobDone {
				<-g.done
				return g.err
			}
			return nil
		}
		if g.waker != nil && g.sendRing == nil {
			return g.progress(job, sends, bytes <= g.opts.SpinMaxBytes)
		}
		job.tokens = make(chan struct{}, len(recvs))
		job.finished = make(chan struct{})
		g.takeLeft() // readLeft releases it when the job is done
		g.jobs <- job
	}
	tokens := 0
	for _, s := range sends {
		if s.afterToken {
			tokens++
			if shm != nil {
				if err := shm.await(tokens); err != nil {
					return err
				}
			} else {
				select {
				case <-job.tokens:
				case <-g.done:
					return g.err
				}
			}
		}
		if g.sendRing != nil {
			if err := g.sendShm(op, job.seq, s.src, shm); err != nil {
				return err
			}
			continue
		}
		h := header{typ: frameData, op: op, seq: job.seq, length: uint32(4 * len(s.src))}
		payload := asBytes(s.src)
		if err := g.writeRight(h, payload); err != nil {
			g.failPeer(g.right, "sending", err)
			<-g.done
			return g.err
		}
	}
	if shm != nil {
		return shm.await(len(recvs))
	}
	select {
	case <-job.finished:
	case <-g.done:
	}
	select {
	case <-job.finished: // completed, even if the group failed just after (a peer closing, say)
		return nil
	default:
		return g.err
	}
}

// inlineSendBytes bounds what an operation that reads and forwards in its
// own goroutine (forwardsInline) sends in all. It must not block on a
// write: while it writes, nobody reads the left neighbour, whose abort
// (when the right neighbour stalls) would end the wait. Sockets' default
// buffers (Linux: 16 KiB to send and 128 KiB to receive before autotuning)
// hold 64 KiB from this operation and what is left of the one before it,
// so the write completes even to a neighbour that stopped reading. With
// smaller buffers the caller's context still ends the operation. It also
// bounds what a rank sends before it starts reading, when no rank reads.
const inlineSendBytes = 64 << 10

// forwardsInline reports whether an operation reads its frames and makes
// its forwards in its own goroutine (run), and the index of its first send that waits for a receipt: only for
// operations over TCP that send at most inlineSendBytes, and whose every
// send after the first that waits for a receipt waits for one of the
// receipts.
func (g *Group) forwardsInline(sends []sendItem, receipts int) (int, bool) {
	if g.sendRing != nil {
		return 0, false
	}
	total := 0
	for _, s := range sends {
		total += 4 * len(s.src)
	}
	if total > inlineSendBytes {
		return 0, false
	}
	first := 0
	for first < len(sends) && !sends[first].afterToken {
		first++
	}
	if len(sends)-first > receipts {
		return 0, false
	}
	for _, s := range sends[first:] {
		if !s.afterToken {
			return 0, false
		}
	}
	return first, true
}

// AllReduce replaces buf on every rank by the element-wise sum over all ranks.
// Every rank ends with bit-identical values: each element is summed once, in a
// fixed order, and copied to the others (or, for a small buffer, summed by
// every rank in that same order from the same inputs).
func (g *Group) AllReduce(ctx context.Context, buf []float32) error {
	g.opMu.Lock()
	defer g.opMu.Unlock()
	if err := g.finishStarted(); err != nil {
		return err
	}
	return g.allReduceLocked(ctx, buf)
}

// allReduceLocked is AllReduce, under opMu, with no operation started.
func (g *Group) allReduceLocked(ctx context.Context, buf []float32) error {
	if g.world == 1 {
		return g.Err()
	}
	if g.gathers(len(buf)) {
		return g.gatherSum(ctx, buf)
	}
	p := g.planFor(opAllReduce, buf, g.ringPlan)
	return g.run(ctx, opAllReduce, 4*len(buf), p.sends, p.recvs)
}

// gathers reports whether an all-reduce of n floats takes the small path.
// Not for two ranks joined by shared memory both ways: there the ring's two
// exchanges of half the buffer cost less than the gather's one of the whole
// and its copies and sums (4 KiB: 1.2 µs against 3.6 in the sitting of
// 2026-11-25 15:10, and the ring faster in the two before; at 16 bytes to
// 1 KiB the two are within a tenth of a microsecond). Both ranks see the
// same two links, so both decide alike.
func (g *Group) gathers(n int) bool {
	if g.opts.GatherBytes <= 0 || 4*n > g.opts.GatherBytes/(g.world-1) {
		return false
	}
	return !(g.world == 2 && g.sendRing != nil && g.recvRing != nil)
}

// plan is the chunks one operation sends and receives, kept for the next
// call on the same buffer: a training loop reduces the same few buffers (its
// gradient buckets) again and again, and planning allocates.
type plan struct {
	sends []sendItem
	recvs []recvItem
}

// planKey names a buffer: the operation, its first element and its length.
type planKey struct {
	op   byte
	base *float32
	n    int
}

// maxPlans bounds the plans kept: a caller that passes ever new buffers
// drops them all and starts again (a plan also keeps its buffer alive).
const maxPlans = 64

// planFor is the plan of operation op on buf, made by build unless one was
// made for the same operation on the same buffer.
func (g *Group) planFor(op byte, buf []float32, build func([]float32) ([]sendItem, []recvItem)) plan {
	key := planKey{op: op, n: len(buf)}
	if len(buf) > 0 {
		key.base = &buf[0]
	}
	if p, ok := g.plans[key]; ok {
		return p
	}
	if g.plans == nil || len(g.plans) >= maxPlans {
		g.plans = make(map[planKey]plan)
	}
	sends, recvs := build(buf)
	p := plan{sends: sends, recvs: recvs}
	g.plans[key] = p
	return p
}

// ringPlan is the ring all-reduce: reduce-scatter, then all-gather.
func (g *Group) ringPlan(buf []float32) ([]sendItem, []recvItem) {
	n, w, r := len(buf), g.world, g.rank
	segs := make([][]float32, w)
	largest := 0
	for i := range w {
		lo, hi := i*n/w, (i+1)*n/w
		segs[i] = buf[lo:hi]
		largest = max(largest, hi-lo)
	}
	if cap(g.scratch) < min(largest, g.opts.ChunkBytes/4) {
		g.scratch = make([]float32, min(largest, g.opts.ChunkBytes/4))
	}
	var sends []sendItem
	var recvs []recvItem
	mod := func(i int) int { return ((i % w) + w) % w }
	// Reduce-scatter: after w-1 steps rank r holds the full sum of segment r+1.
	for s := range w - 1 {
		for _, c := range g.chunks(segs[mod(r-s)]) {
			sends = append(sends, sendItem{src: c, afterToken: s > 0})
		}
		for _, c := range g.chunks(segs[mod(r-s-1)]) {
			recvs = append(recvs, recvItem{dst: c, add: true})
		}
	}
	// All-gather: pass the summed segments around the ring.
	for s := range w - 1 {
		for _, c := range g.chunks(segs[mod(r-s+1)]) {
			sends = append(sends, sendItem{src: c, afterToken: true})
		}
		for _, c := range g.chunks(segs[mod(r-s)]) {
			recvs = append(recvs, recvItem{dst: c})
		}
	}
	return sends, recvs
}

// gatherSum is the small all-reduce: in world-1 ring steps every rank sends
// its buffer and forwards the one it received a step earlier, so each ends
// with all of them; then each sums them, segment by segment, in the order
// the ring would have: the same additions in the same order on every rank,
// and the same sums as the ring's.
func (g *Group) gatherSum(ctx context.Context, buf []float32) error {
	n, w, r := len(buf), g.world, g.rank
	if cap(g.gathered) < w*n {
		g.gathered = make([]float32, w*n)
		g.plans = nil // the gathering plans' chunks point into the old slice
	}
	// got[k] (k < w-1) is the buffer received at step k, rank r-1-k's;
	// the last n floats are where the sum is made.
	got := g.gathered[:w*n]
	p := g.planFor(opGatherSum, buf, func(buf []float32) ([]sendItem, []recvItem) {
		var sends []sendItem
		var recvs []recvItem
		for s := range w - 1 {
			src := buf
			if s > 0 {
				src = got[(s-1)*n : s*n]
			}
			for _, c := range g.chunks(src) {
				sends = append(sends, sendItem{src: c, afterToken: s > 0})
			}
			for _, c := range g.chunks(got[s*n : (s+1)*n]) {
				recvs = append(recvs, recvItem{dst: c})
			}
		}
		return sends, recvs
	})
	if err := g.run(ctx, opGatherSum, 4*n*(w-1), p.sends, p.recvs); err != nil {
		return err
	}
	// Rank q's buffer: our own, or the one received at step r-1-q (mod w).
	of := func(q int) []float32 {
		if q == r {
			return buf
		}
		k := ((r-1-q)%w + w) % w
		return got[k*n : (k+1)*n]
	}
	// Each segment is summed in the order the ring sums it (ringPlan):
	// segment k starts from rank k's values, then adds rank k+1's, k+2's,
	// ... around the ring. The result is the ring's, bit for bit, so which
	// of the two an operation takes changes its speed, never its sums.
	// The segments are small (the whole buffer is at most GatherBytes over
	// world-1): plain loops, not world² calls into BLAS (cgo with OpenBLAS);
	// a float32 add rounds the same either way.
	sum := got[(w-1)*n:]
	for k := range w {
		lo, hi := k*n/w, (k+1)*n/w
		seg := sum[lo:hi]
		copy(seg, of(k)[lo:hi])
		for j := 1; j < w; j++ {
			for i, x := range of((k + j) % w)[lo:hi] {
				seg[i] += x
			}
		}
	}
	copy(buf, sum)
	return nil
}

// Broadcast copies root's buf to every rank, pipelined along the ring.
func (g *Group) Broadcast(ctx context.Context, buf []float32, root int) error {
	if root < 0 || root >= g.world {
		return fmt.Errorf("collective: broadcast root %d out of range; want 0..%d", root, g.world-1)
	}
	g.opMu.Lock()
	defer g.opMu.Unlock()
	if err := g.finishStarted(); err != nil {
		return err
	}
	if g.world == 1 {
		return g.Err()
	}
	var sends []sendItem
	var recvs []recvItem
	for _, c := range g.chunks(buf) {
		if g.rank != root {
			recvs = append(recvs, recvItem{dst: c})
		}
		if g.right != root {
			sends = append(sends, sendItem{src: c, afterToken: g.rank != root})
		}
	}
	return g.run(ctx, opBroadcast, 4*len(buf), sends, recvs)
}

// Barrier returns once every rank has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	return g.AllReduce(ctx, nil)
}

// chunks cuts a segment into pipelining units; an empty segment is one empty
// chunk, so every step of the ring still synchronises its two ranks.
func (g *Group) chunks(seg []float32) [][]float32 {
	per := g.opts.ChunkBytes / 4
	if len(seg) == 0 {
		return [][]float32{seg}
	}
	out := make([][]float32, 0, (len(seg)+per-1)/per)
	for len(seg) > 0 {
		k := min(per, len(seg))
		out = append(out, seg[:k])
		seg = seg[k:]
	}
	return out
}
