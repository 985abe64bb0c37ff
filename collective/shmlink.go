package collective

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/durabletrain/durabletrain/internal/race"
)

// A link between neighbours on one host carries its data through shared
// memory and signals through it too: the sender fills a slot, writes the
// slot's descriptor and bumps the ring's published counter; the receiver,
// polling that counter (for Options.SpinWindow, while it is in an
// operation) or sleeping on it (a futex the sender wakes only when the
// receiver said it sleeps), takes the chunk and bumps the consumed counter,
// which frees the slot. Nothing crosses TCP for the data: the connection
// carries keepalives and aborts, as it does between hosts, so a stalled or
// dead neighbour is found the same way.
//
// The receiving side runs in the goroutine of the operation itself, not in
// readLeft: a step of a small all-reduce is then a store, a load and a
// copy, with no goroutine to wake. While it waits for a free slot to send
// into, an operation drains what its left neighbour has published, so that
// a ring of full rings always moves on.

// shmSleep bounds each sleep on a counter: a sleeper rechecks whether its
// group failed at least this often (fail also wakes it).
const shmSleep = 20 * time.Millisecond

// shmReceiver is the receiving half of one operation on a shared-memory link.
type shmReceiver struct {
	g        *Group
	job      *recvJob
	received int // items of job taken so far
	spin     time.Duration
}

// take moves every chunk of this operation that the left neighbour has
// published into its item, in order; it reports whether it took any.
func (r *shmReceiver) take() (bool, error) {
	g, ring := r.g, r.g.recvRing
	published := ring.published().Load()
	ring.acquire()
	took := false
	for uint32(g.shmDrained) != published && r.received < len(r.job.items) {
		if published-uint32(g.shmDrained) > uint32(ring.slots) {
			g.failPeer(g.left, "protocol error", fmt.Errorf("shared-memory ring claims %d chunks in %d slots", published-uint32(g.shmDrained), ring.slots))
			return took, g.err
		}
		slot := int(g.shmDrained % uint64(ring.slots))
		seqW, opW, lenW := ring.desc(slot)
		seq, op, length := seqW.Load(), opW.Load(), lenW.Load()
		it := r.job.items[r.received]
		if seq != r.job.seq || op != uint32(r.job.op) || int(length) != 4*len(it.dst) || int(length) > ring.slotBytes {
			g.failPeer(g.left, "protocol error", fmt.Errorf(
				"received operation #%d kind %d with %d bytes, expected operation #%d kind %d with %d bytes: ranks called collectives in different orders or with different lengths",
				seq, op, length, r.job.seq, r.job.op, 4*len(it.dst)))
			return took, g.err
		}
		src := asFloats(ring.slot(slot)[:length])
		if it.add {
			addInto(it.dst, src)
		} else {
			copy(it.dst, src)
		}
		g.shmDrained++
		ring.release()
		ring.consumed().Store(uint32(g.shmDrained)) // the slot is the sender's again
		if ring.sendWaiting().Load() != 0 {
			futexWake(ring.consumed())
		}
		r.received++
		took = true
	}
	return took, nil
}

// await returns once n items of the operation have been taken.
func (r *shmReceiver) await(n int) error {
	g := r.g
	wait := spinWait{window: r.spin}
	for r.received < n {
		if took, err := r.take(); err != nil {
			return err
		} else if took {
			wait = spinWait{window: r.spin}
			continue
		}
		if err := g.Err(); err != nil {
			return err
		}
		if g.leftClosed.Load() {
			// It closed after its last operation: what it published before is
			// visible now, and anything more will not come.
			if took, err := r.take(); err != nil || took {
				if err != nil {
					return err
				}
				continue
			}
			g.blame(g.left, closedReason+" before sending this operation's data")
			return g.err
		}
		if wait.poll(g) {
			continue
		}
		g.sleepOnLeft()
	}
	return nil
}

// sleepOnLeft sleeps until the left neighbour publishes a chunk past those
// this rank has drained, the group fails, or shmSleep passes.
func (g *Group) sleepOnLeft() {
	ring := g.recvRing
	seen := uint32(g.shmDrained)
	ring.recvWaiting().Store(1)
	if ring.published().Load() == seen && g.Err() == nil && !g.leftClosed.Load() {
		futexWait(ring.published(), seen, shmSleep)
	}
	ring.recvWaiting().Store(0)
}

// sendShm puts one chunk of operation seq in the next free slot of the
// right neighbour's ring and publishes it. While the ring is full it takes
// what the left neighbour has published for this operation (recv, if the
// left link is shared memory too).
func (g *Group) sendShm(op byte, seq uint32, src []float32, recv *shmReceiver) error {
	wait := spinWait{window: g.spin}
	for !g.trySendShm(op, seq, src) {
		if recv != nil {
			if took, err := recv.take(); err != nil {
				return err
			} else if took {
				continue
			}
		}
		if err := g.Err(); err != nil {
			return err
		}
		if wait.poll(g) {
			continue
		}
		sleep := shmSleep
		if recv != nil {
			sleep = time.Millisecond // our left neighbour may publish meanwhile: look again soon
		}
		g.sleepOnRight(sleep)
	}
	return nil
}

// sleepOnRight sleeps while the right neighbour's ring is full, until it
// consumes a chunk, the group fails, or d passes.
func (g *Group) sleepOnRight(d time.Duration) {
	ring := g.sendRing
	consumed := ring.consumed().Load()
	ring.sendWaiting().Store(1)
	if uint32(g.shmSent)-ring.consumed().Load() >= uint32(ring.slots) && g.Err() == nil {
		futexWait(ring.consumed(), consumed, d)
	}
	ring.sendWaiting().Store(0)
}

// trySendShm puts one chunk of operation seq in the next free slot of the
// right neighbour's ring and publishes it; false, and nothing done, while
// the ring is full.
func (g *Group) trySendShm(op byte, seq uint32, src []float32) bool {
	ring := g.sendRing
	if uint32(g.shmSent)-ring.consumed().Load() >= uint32(ring.slots) {
		return false
	}
	ring.acquire()
	slot := int(g.shmSent % uint64(ring.slots))
	payload := asBytes(src)
	copy(ring.slot(slot), payload)
	if race.Enabled {
		raceShmSends.Add(1)
	}
	seqW, opW, lenW := ring.desc(slot)
	seqW.Store(seq)
	opW.Store(uint32(op))
	lenW.Store(uint32(len(payload)))
	g.shmSent++
	ring.release()
	ring.published().Store(uint32(g.shmSent))
	if ring.recvWaiting().Load() != 0 {
		futexWake(ring.published())
	}
	return true
}

// raceShmSends orders, for the race detector only (race.Enabled), what an
// operation read of its buffer to send through shared memory before what
// its left TCP link later writes there: the data that comes back went
// around the ring after it. Over TCP the sender's write(2) and the
// reader's read(2) order them (the syscall package tells the detector);
// shared memory tells it nothing, so a rank whose right link is shared
// memory and whose left is TCP looked like a race (a gang where
// /dev/shm had room for one ring, 2026-11-27).
var raceShmSends atomic.Uint64

// spinWait polls a ring for a window before its loop sleeps on the futex.
type spinWait struct {
	window time.Duration // 0: no polling
	until  time.Time
	spins  int
	// yield, when set, is watched between looks: looking stops once the
	// rank lost its core to other work (coreYielder.gosched).
	yield *coreYielder
}

// poll pauses once and reports true while the window lasts (the clock is
// read every 64 polls); false: time to sleep.
func (w *spinWait) poll(g *Group) bool {
	if w.window <= 0 {
		return false
	}
	if w.until.IsZero() {
		w.until = time.Now().Add(w.window)
	}
	if w.spins++; w.spins%64 != 0 || time.Now().Before(w.until) {
		if w.yield != nil {
			return w.yield.ready() && w.yield.gosched()
		}
		return g.pause()
	}
	return false
}

// pause is one wait between two looks at a ring: a yield of the goroutine,
// or of the core where ranks outnumber cores (the rank polled for may be
// the one that needs it). False: stop looking, a yield lost the core to a
// process not of ours (coreYielder).
func (g *Group) pause() bool {
	if g.yield == nil {
		runtime.Gosched()
		return true
	}
	return g.yield.ready() && g.yield.yield()
}

// wakeRings wakes this rank's own sleepers on its rings (the group failed).
func (g *Group) wakeRings() {
	if g.recvRing != nil {
		futexWake(g.recvRing.published())
	}
	if g.sendRing != nil {
		futexWake(g.sendRing.consumed())
	}
}
