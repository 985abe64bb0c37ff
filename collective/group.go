package collective

import (
	"bufio"
	"context"
	"crypto/ecdh"
	"errors"
	"fmt"
	"io"
	"net"
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
	// ChunkBytes is the pipelining unit over TCP: segments are cut into chunks of this
	// size so that sending, receiving and summing overlap. Default 1 MiB.
	ChunkBytes int
	// ShmChunkBytes is the pipelining unit over shared memory, where each chunk
	// is copied into a slot of the neighbour's ring and summed out of it while the
	// next one is copied in: at most ChunkBytes. Default 128 KiB (measured, 2 ranks
	// on 2 cores: a 16 MiB all-reduce took 1.1 ms in 128 KiB chunks, 2.0 ms in 1 MiB
	// ones; BENCHMARKS.md).
	ShmChunkBytes int
	// ShmRingBytes is what the shared-memory ring this rank offers its left
	// neighbour holds: how far that neighbour may send ahead of this rank's
	// reading, in slots of ShmChunkBytes (at least 4, at most 224). Default
	// 4 MiB (measured with a CPU-bound process per core beside 4 ranks: rings
	// of 4 slots of 128 KiB made 16 and 64 MiB all-reduces about twice as slow
	// as rings of 32; BENCHMARKS.md). `bench allreduce -shm-ring` sweeps it.
	ShmRingBytes int
	// SpinWindow is how long a rank in a small operation (at most SpinMaxBytes)
	// busy-polls for its left neighbour's next frame before it sleeps. Waking a
	// sleeping process costs more than a small step. A larger operation over
	// TCP polls too where every rank on the host has a core, until the system
	// takes the core from the rank for other work (a loaded host), and then
	// sleeps at once for a while (measured, 2 ranks on 2 cores: 1 MiB 11% and
	// 16 MiB 30% faster idle, 18% and 7% loaded; BENCHMARKS.md). Default
	// 200µs; negative never spins.
	SpinWindow time.Duration
	// SpinMaxBytes is the largest operation that spins at any time. Default 256 KiB.
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
	// GatherLinks gathers those small all-reduces of 3 ranks or more over
	// links to the ranks 2, 4, 8, ... away as well as the ring, in
	// ceil(log2(world)) steps instead of world-1, with the same sums
	// (skiplinks.go). Join connects those links, and needs the addresses of
	// those ranks in Gang.Peers. Set it where the ring is not shared memory
	// all the way round: a gang over TCP, or spread over hosts; on one host
	// with shared memory a step around the ring costs microseconds and a
	// link is loopback TCP. Every rank must set the same value; Join fails
	// naming a neighbour that differs. Ranks of releases before it never
	// gather over links.
	GatherLinks bool
	// RefusedTimeout is how long the right neighbour's address may refuse
	// connections (nothing listens there) before Join gives up on it with a
	// *PeerError naming it. Zero waits until ctx ends: a listener may still be
	// starting, as a rank process's does. Set it where every peer's listener
	// was up before the gang formed (a worker listens before it grants a
	// slot): there a refusal means the peer's process is gone, and waiting on
	// would leave the gang to find out at a heartbeat timeout.
	RefusedTimeout time.Duration
	// UnreachableTimeout is how long one attempt to connect to the right
	// neighbour's address may go unanswered, neither accepted nor refused
	// (the host is cut off, or gone from the network), or fail as
	// unreachable, before Join gives up on it with a *PeerError naming it.
	// A listener that is up answers within a round trip even when its
	// process is stopped: the kernel completes the connection. Zero waits
	// until ctx ends (the operating system's own retries, about two minutes
	// on Linux). Keep it above the network's worst round trip and a lost
	// SYN's retransmission (1 s on Linux).
	UnreachableTimeout time.Duration
	// Transport is TransportAuto (shared memory with neighbours on the same
	// host, TCP otherwise), TransportTCP or TransportSameIP.
	Transport string
	// HostWindows, where every rank of the gang is on one host (both of
	// every rank's links shared memory), has each rank expose a window of
	// shared memory that every other maps, and runs AllReduce, Broadcast and
	// Barrier through the windows: two barriers per piece instead of the
	// ring's 2(world-1) steps, the same sums bit for bit (windows.go).
	// Measured on 2 cores, 1 MiB, against OpenMPI's shared memory, two
	// sittings: 1.72-1.73x its bus bandwidth with 2 ranks and 1.23-1.44x
	// with 4, where the ring gave 1.40x and 0.82-0.84x (BENCHMARKS.md).
	// Join falls back to the ring, quietly, where any rank cannot map every
	// window (a gang spread over hosts, a full /dev/shm). Every rank must set the same value; Join
	// fails naming a neighbour that differs. Ranks of releases before it
	// never use windows. Operations that StartAllReduce leaves to the
	// caller (CallerDriven) still run around the ring, moved by the
	// caller's own thread: training 2 ranks on 2 cores, buckets so moved
	// gave 90.7% of twice one rank's throughput, through windows (each
	// bucket's all-reduce on a goroutine) 79.6% (BENCHMARKS.md). Every
	// rank must make the same calls, as always: a rank that started an
	// operation where another called AllReduce waits for it.
	HostWindows bool
	// WindowBytes is each half of a rank's window: an all-reduce moves at
	// most this much per rank between two barriers. Default 1 MiB; at least
	// 4 KiB, and the same on every rank (else no windows).
	WindowBytes int
	// WindowMaxBytes is the largest all-reduce or broadcast that goes
	// through the windows; a larger one runs around the ring, after one
	// barrier through the windows that checks every rank began the same
	// operation. Default 4 MiB: beside a CPU-bound process per core the
	// ring was faster from 8 MiB up (BENCHMARKS.md). Every rank must use
	// the same value: where they differ, the operation fails with a
	// protocol error.
	WindowMaxBytes int
	// Progress says who moves an operation started by StartAllReduce:
	// ProgressAuto (default), ProgressCaller or ProgressNever (driven.go).
	Progress string
	// Logger receives one line per connection refused and per group failure,
	// and at debug level one per join (transports, skip links). Default: none.
	Logger *zap.Logger
	// OnFailure, if set, is called once, in a goroutine of its own, with
	// the group's error when the group fails (not when its own rank closes
	// it), whether or not an operation is running: a rank off its cores
	// between operations learns of a failure only when it runs again.
	OnFailure func(error)

	// hostCores is the cores Join counts on this host; 0: runtime.NumCPU().
	// Tests set it to take the paths of a host with more ranks than cores,
	// or fewer, whatever this machine has.
	hostCores int
}

const (
	minSecretLen       = 16
	defaultStall       = 5 * time.Second
	defaultChunkBytes  = 1 << 20
	defaultShmChunk    = 128 << 10
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
	if o.ShmChunkBytes <= 0 {
		o.ShmChunkBytes = defaultShmChunk
	}
	o.ShmChunkBytes = max(4, min(o.ShmChunkBytes&^3, o.ChunkBytes))
	if o.SpinWindow == 0 {
		o.SpinWindow = 200 * time.Microsecond
	}
	if o.SpinMaxBytes == 0 {
		o.SpinMaxBytes = 256 << 10
	}
	if o.WindowBytes <= 0 {
		o.WindowBytes = defaultWindowBytes
	}
	if o.WindowMaxBytes <= 0 {
		o.WindowMaxBytes = defaultWindowMaxBytes
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Group is one rank's membership in a gang. Operations must be called in the
// same order with the same lengths on every rank; one at a time per group.
type Group struct {
	gang        Gang
	rank, world int
	left, right int // neighbour ranks
	opts        Options
	log         *zap.Logger
	// flags are this rank's choices that every link's two ends must share
	// (hello.Flags): flagGatherLinks, flagHostWindows.
	flags byte
	// skips are the links the small all-reduce gathers over besides the
	// ring's, one per distance 2, 4, 8, ... below the world (skiplinks.go);
	// nil where it gathers around the ring.
	skips []*skipLink

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
	// largeSpin: every rank here has a core, and a large operation over TCP
	// looks for its frames until the system takes the core for other work
	// (progress); nil: it sleeps at once.
	largeSpin   *coreYielder
	leftClosed  atomic.Bool // the left neighbour closed its group gracefully (shared-memory links)
	rightClosed atomic.Bool // the right neighbour closed its group gracefully
	// nbLeft and nbRight are the links read and written without blocking by
	// an operation's progress loop, woken by waker when the group fails
	// (progress.go); nil where the platform has none.
	nbLeft, nbRight nbLink
	waker           *progressWaker
	writeMu         sync.Mutex
	frameBuf        []byte // header and small payload, under writeMu
	leftWriteMu     sync.Mutex
	lastWrite       atomic.Int64 // unix nanos of the last frame to the right
	// longGap is the longest silence toward the right neighbour that ended
	// within a StallTimeout of longGapEnd (unix nanos; wroteRight).
	longGap, longGapEnd atomic.Int64
	offCoresAt          atomic.Int64 // unix nanos when keepalive last woke late (leftSilent)

	// Counted for tests: operations that took the left link from readLeft,
	// data frames read before their operation began, operations run by a
	// progress loop, and read deadlines that passed with bytes waiting
	// (leftSilent).
	leftTaken, leftEarly, progressOps, leftLookedAgain atomic.Int64
	skipPings                                          atomic.Int64 // pings sent over skip links

	opMu    sync.Mutex
	seq     uint32
	driven  bool        // StartAllReduce leaves its operations to the caller (driven.go)
	started []*drivenOp // operations started and not yet complete, oldest first
	jobs    chan *recvJob
	scratch []float32
	// sendPer and recvPer are the chunk lengths, in floats, of the right link
	// and the left one: ShmChunkBytes over shared memory, ChunkBytes over TCP.
	// A link's two ends agree, since both know what it is.
	sendPer, recvPer int
	// gathered holds the other ranks' buffers of a small all-reduce and the
	// sum being made (world × its length); plans the plans made, reused
	// while the caller passes the same buffers (at most maxPlans of them).
	gathered []float32
	plans    map[planKey]plan
	// windows, where the gang reduces through host windows (windows.go);
	// set at Join, then read only.
	windows *hostWindows

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
	case opts.WindowBytes < minWindowBytes || opts.WindowBytes%4 != 0 || opts.WindowBytes > maxWindowBytes:
		return nil, fmt.Errorf("collective: options.WindowBytes %d; want a multiple of 4 from %d to %d (0: %d)", opts.WindowBytes, minWindowBytes, maxWindowBytes, defaultWindowBytes)
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
	if gathersOverLinks(opts, world) {
		// A ring needs only its neighbours' addresses; the links need their
		// far ends' too.
		for _, d := range skipDistances(world) {
			for _, r := range []int{(rank + d) % world, (rank - d + world) % world} {
				if gang.Peers[r] == "" {
					return nil, fmt.Errorf("collective: gang.Peers[%d] is empty; options.GatherLinks needs the addresses of the ranks 2, 4, 8, ... away on both sides of rank %d (or leave it off)", r, rank)
				}
			}
		}
		g.flags |= flagGatherLinks
	}
	if opts.HostWindows {
		g.flags |= flagHostWindows
	}
	var err error
	if g.rightConn, g.leftConn, err = g.connect(ctx, ln, g.right, g.left); err != nil {
		return nil, err
	}
	if err := g.negotiateShm(ctx); err != nil {
		g.leftConn.Close()
		g.rightConn.Close()
		return nil, fmt.Errorf("collective: rank %d: %w", rank, err)
	}
	if g.flags&flagGatherLinks != 0 {
		if err := g.joinSkipLinks(ctx, ln); err != nil {
			g.leftConn.Close()
			g.rightConn.Close()
			for _, r := range []*shmRing{g.sendRing, g.recvRing} {
				if r != nil {
					r.close()
				}
			}
			if g.windows != nil {
				g.unmapWindows()
			}
			return nil, fmt.Errorf("collective: rank %d: connecting the links the small all-reduce gathers over: %w", rank, err)
		}
	}
	g.sendPer, g.recvPer = opts.ChunkBytes/4, opts.ChunkBytes/4
	if g.sendRing != nil {
		g.sendPer = opts.ShmChunkBytes / 4
	}
	if g.recvRing != nil {
		g.recvPer = opts.ShmChunkBytes / 4
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
	if g.yield == nil && opts.SpinWindow > 0 {
		g.largeSpin = new(coreYielder)
	}
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
	g.readySkipLinks(spin)
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
	g.wg.Add(3 + len(g.skips))
	go g.readLeft()
	go g.readRight()
	go g.keepalive()
	for _, l := range g.skips {
		go g.watchSkip(l)
	}
	send, receive := g.Transports()
	g.log.Debug("joined the gang", zap.Int("world", world), zap.String("send", send), zap.String("receive", receive),
		zap.Int("skip_links", len(g.skips)), zap.Bool("caller_driven", g.driven))
	return g, nil
}

// connect dials rank `to` and accepts rank `from` through ln, at once, and
// checks that both share this rank's flags. It returns when both
// connections are up, or with the first error (closing what it opened).
func (g *Group) connect(ctx context.Context, ln *Listener, to, from int) (out, in net.Conn, err error) {
	dialSecret, err := linkSecret(g.gang, g.rank, g.rank, to, g.opts)
	if err != nil {
		return nil, nil, err
	}
	acceptSecret, err := linkSecret(g.gang, g.rank, from, g.rank, g.opts)
	if err != nil {
		return nil, nil, err
	}
	type result struct {
		conn  net.Conn
		flags byte
		err   error
	}
	dialed, accepted := make(chan result, 1), make(chan result, 1)
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, flags, err := g.dial(jctx, to, dialSecret)
		dialed <- result{c, flags, err}
	}()
	go func() {
		k := connKey{run: g.gang.Run, gen: g.gang.Generation, from: uint32(from), to: uint32(g.rank), world: uint32(g.world)}
		c, flags, err := ln.accept(jctx, k, acceptSecret, g.flags)
		if err != nil {
			err = fmt.Errorf("collective: rank %d: waiting for rank %d (%s) to connect: %w", g.rank, from, g.gang.Peers[from], err)
		}
		accepted <- result{c, flags, err}
	}()
	var firstErr error
	for range 2 {
		var r result
		peer := to
		select {
		case r = <-dialed:
			out = r.conn
		case r = <-accepted:
			in, peer = r.conn, from
		}
		if r.err == nil && r.flags != g.flags {
			// The other half goes on: its peer learns of the difference from
			// this rank's flags, at once, rather than wait for its context.
			if firstErr == nil {
				firstErr = flagsDiffer(peer, g.gang.Peers[peer], r.flags, g.rank, g.flags)
			}
			continue
		}
		if r.err != nil && firstErr == nil {
			firstErr = r.err
			cancel()
		}
	}
	if firstErr != nil {
		for _, c := range []net.Conn{out, in} {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, firstErr
	}
	return out, in, nil
}

// flagsDiffer is Join's error for a neighbour whose flags differ from this
// rank's, naming the first option that differs.
func flagsDiffer(peer int, addr string, theirs byte, rank int, ours byte) error {
	if (theirs^ours)&flagGatherLinks != 0 {
		return fmt.Errorf("collective: rank %d (%s) %s small all-reduces over links to the ranks 2, 4, 8, ... away and rank %d %s: every rank needs the same options.GatherLinks, GatherBytes and Transport, and a release that has GatherLinks (0.6.0 or later)",
			peer, addr, gathersWord(theirs), rank, gathersWord(ours))
	}
	word := func(f byte) string {
		if f&flagHostWindows != 0 {
			return "reduces through host windows"
		}
		return "does not reduce through host windows"
	}
	return fmt.Errorf("collective: rank %d (%s) %s and rank %d %s: every rank needs the same options.HostWindows, and a release that has it (0.6.0 or later)",
		peer, addr, word(theirs), rank, word(ours))
}

func gathersWord(flags byte) string {
	if flags&flagGatherLinks != 0 {
		return "gathers"
	}
	return "does not gather"
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

// dial connects to rank `to`, retrying until its listener is up, and
// returns the connection and the flags its acceptor answered with.
func (g *Group) dial(ctx context.Context, to int, secret []byte) (net.Conn, byte, error) {
	addr := g.gang.Peers[to]
	h := hello{Run: g.gang.Run, Generation: g.gang.Generation, From: uint32(g.rank), To: uint32(to), World: uint32(g.world), Flags: g.flags}
	backoff := 20 * time.Millisecond
	var d net.Dialer
	var refusedSince time.Time     // when the address began refusing, if it does
	var unreachableSince time.Time // when an attempt began that got no answer, if one did
	for {
		attempt, started := ctx, time.Now()
		cancelAttempt := func() {}
		if g.opts.UnreachableTimeout > 0 {
			attempt, cancelAttempt = context.WithTimeout(ctx, g.opts.UnreachableTimeout)
		}
		conn, err := d.DialContext(attempt, "tcp", addr)
		cancelAttempt()
		switch {
		case err == nil || !errors.Is(err, syscall.ECONNREFUSED):
			refusedSince = time.Time{}
		case refusedSince.IsZero():
			refusedSince = time.Now()
		case g.opts.RefusedTimeout > 0 && time.Since(refusedSince) >= g.opts.RefusedTimeout:
			return nil, 0, &PeerError{Rank: to, Addr: addr, Reporter: g.rank,
				Reason: fmt.Sprintf("its address refused connections for %v: nothing listens there (its worker is gone)", time.Since(refusedSince).Round(time.Millisecond))}
		}
		if err == nil || ctx.Err() != nil || !unanswered(err) {
			unreachableSince = time.Time{}
		} else if g.opts.UnreachableTimeout > 0 {
			if unreachableSince.IsZero() {
				unreachableSince = started
			}
			if time.Since(unreachableSince) >= g.opts.UnreachableTimeout {
				return nil, 0, &PeerError{Rank: to, Addr: addr, Reporter: g.rank,
					Reason: fmt.Sprintf("its address answered no connection attempt for %v (%v): its host is cut off or gone", time.Since(unreachableSince).Round(time.Millisecond), err)}
			}
		}
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			var flags byte
			flags, err = dialHandshake(ctx, conn, secret, h)
			if err == nil {
				return conn, flags, nil
			}
			conn.Close()
			if errors.Is(err, errAuth) {
				return nil, 0, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w", g.rank, to, addr, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w (last error: %v)", g.rank, to, addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
		if g.opts.RefusedTimeout > 0 && !refusedSince.IsZero() {
			backoff = min(backoff, g.opts.RefusedTimeout/4) // look again within the timeout
		}
	}
}

// unanswered reports whether a connection attempt failed for want of any
// answer from the address: it timed out, or the network says the host
// cannot be reached. A refusal is an answer (RefusedTimeout).
func unanswered(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
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
	if g.windows != nil {
		g.markWindowClosed()
	}
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
		if g.windows != nil {
			g.unmapWindows()
		}
	})
	return nil
}
