package collective

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
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
