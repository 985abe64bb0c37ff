package collective

import (
	"context"
	"time"
)

// Operations the caller drives: StartAllReduce hands an all-reduce to the
// group and returns at once; the caller's own goroutine then moves it
// along, between pieces of its computation (Progress), and finishes it
// (Wait). Nothing else runs it: no goroutine is woken, no thread is added.
//
// Why: a host whose ranks fill its cores (2 ranks on 2 cores, 8 on 8) has
// no core for a thread that communicates beside the one that computes.
// Such a thread only takes its turn on a core from a rank that computes,
// and every hand-over between the two costs a wake-up; measured with the
// native trainer, 2 ranks on 2 cores, a step waited 0.65 ms for buckets its
// all-reducing goroutine had not had the core to move. MPI's progress
// engine works this way (an MPI_Isend moves at MPI_Test); so do NCCL's
// proxy-less shared-memory transfers.
//
// The operations of a group whose ranks fill the host's cores and whose
// links are both shared memory are driven by the caller (CallerDriven);
// Options.Progress overrides the choice. On any other group, StartAllReduce
// completes the operation before it returns: callers that want overlap
// there run AllReduce on a goroutine of their own.

// Progress modes (Options.Progress).
const (
	ProgressAuto   = ""       // the caller drives where the host's ranks fill its cores and both links are shared memory
	ProgressCaller = "caller" // the caller drives wherever both links are shared memory
	ProgressNever  = "never"  // StartAllReduce always completes the operation before it returns
)

// drivenOp is a started all-reduce: its plan, and how far it has come.
type drivenOp struct {
	sends []sendItem
	recv  shmReceiver // its job: the operation's seq and the chunks to receive
	sent  int         // sends made
	stop  func() bool // stops the context's watch
}

// CallerDriven reports whether StartAllReduce returns before its operation
// completes, leaving it to Progress and Wait.
func (g *Group) CallerDriven() bool { return g.driven }

// callerDriven decides CallerDriven at Join.
func callerDriven(mode string, shmBothWays bool, ranksHere, cores int) bool {
	switch {
	case !shmBothWays || mode == ProgressNever:
		return false
	case mode == ProgressCaller:
		return true
	}
	return ranksHere >= cores
}

// StartAllReduce begins replacing buf by the element-wise sum over all
// ranks, with AllReduce's sums bit for bit. On a CallerDriven group it
// returns at once: buf must then be left alone until Wait returns, and the
// operation moves only while this rank calls Progress or Wait. Operations
// started complete in the order started; any other operation of the group
// (AllReduce, Broadcast, Barrier) first waits for them. Like every
// operation, it must be called in the same order with the same lengths on
// every rank. Cancelling ctx before the operation completes fails the
// group.
func (g *Group) StartAllReduce(ctx context.Context, buf []float32) error {
	g.opMu.Lock()
	defer g.opMu.Unlock()
	if !g.driven || g.world == 1 || g.gathers(len(buf)) {
		if err := g.finishStarted(); err != nil {
			return err
		}
		return g.allReduceLocked(ctx, buf)
	}
	if err := g.Err(); err != nil {
		return err
	}
	p := g.planFor(opAllReduce, buf, g.ringPlan)
	g.seq++
	op := &drivenOp{sends: p.sends, recv: shmReceiver{g: g, job: &recvJob{seq: g.seq, op: opAllReduce, items: p.recvs}}}
	seq := g.seq
	op.stop = g.abortWhenDone(ctx, seq)
	g.started = append(g.started, op)
	_, err := g.advanceStarted()
	return err
}

// Progress moves the started operations along as far as they go without
// waiting, and returns the group's error if it failed. Cheap when nothing
// has arrived: call it between pieces of computation.
func (g *Group) Progress() error {
	g.opMu.Lock()
	defer g.opMu.Unlock()
	if _, err := g.advanceStarted(); err != nil {
		return err
	}
	return g.Err()
}

// Wait returns once every started operation has completed, or with the
// group's error.
func (g *Group) Wait() error {
	g.opMu.Lock()
	defer g.opMu.Unlock()
	return g.finishStarted()
}

// advanceStarted moves the started operations, oldest first, as far as
// they go now; moved reports whether anything did.
func (g *Group) advanceStarted() (moved bool, err error) {
	for len(g.started) > 0 {
		op := g.started[0]
		m, done, err := g.advance(op)
		moved = moved || m
		if err != nil {
			g.dropStarted()
			return moved, err
		}
		if !done {
			return moved, nil
		}
		op.stop()
		g.started[0] = nil
		g.started = g.started[1:]
	}
	g.started = nil
	return moved, nil
}

// dropStarted abandons the started operations of a failed group.
func (g *Group) dropStarted() {
	for _, op := range g.started {
		op.stop()
	}
	g.started = nil
}

// advance makes op's sends and takes its receipts while each can be made
// without waiting: a send that follows a receipt goes once that receipt is
// in, into a free slot of the right neighbour's ring.
func (g *Group) advance(op *drivenOp) (moved, done bool, err error) {
	if err := g.Err(); err != nil {
		return false, false, err
	}
	for {
		took, err := op.recv.take()
		if err != nil {
			return moved, false, err
		}
		sent := false
		for op.sent < len(op.sends) {
			s := op.sends[op.sent]
			if s.after > op.recv.received {
				break // its receipt is not in yet
			}
			if !g.trySendShm(opAllReduce, op.recv.job.seq, s.src) {
				break // the right neighbour's ring is full
			}
			op.sent++
			sent = true
		}
		if op.sent == len(op.sends) && op.recv.received == len(op.recv.job.items) {
			return true, true, nil
		}
		if !took && !sent {
			return moved, false, nil
		}
		moved = true
	}
}

// finishStarted drives the started operations to completion: it looks
// again while they move, polls for the spin window, yielding as pause
// does, then sleeps on the ring it waits for, woken by the neighbour that
// moves it. Unlike AllReduce it polls whatever the operation's size: the
// caller drives only where the ranks fill the cores, so a rank that
// polls holds its own core, or yields it where ranks outnumber cores, and
// what is left of a step's all-reduce when backward ends is what the
// step waits for (measured, 2 ranks on 2 cores: 74% of twice 1 rank
// with a 940 KB all-reduce after backward that slept, 88-91% polling).
func (g *Group) finishStarted() error {
	wait := spinWait{window: g.spin}
	for len(g.started) > 0 {
		moved, err := g.advanceStarted()
		if err != nil {
			return err
		}
		if len(g.started) == 0 {
			return nil
		}
		if moved {
			wait = spinWait{window: g.spin}
			continue
		}
		if g.leftClosed.Load() {
			// It closed after its last operation: what it published before is
			// visible now, and anything more will not come.
			if moved, err := g.advanceStarted(); err != nil {
				return err
			} else if moved || len(g.started) == 0 {
				continue
			}
			g.blame(g.left, closedReason+" before sending this operation's data")
			g.dropStarted()
			return g.err
		}
		if wait.poll(g) {
			continue
		}
		op := g.started[0]
		if op.sent < len(op.sends) && op.sends[op.sent].after <= op.recv.received {
			// Held by a full ring: sleep until the neighbour consumes, but not
			// for long, as our left neighbour may publish meanwhile.
			g.sleepOnRight(time.Millisecond)
			continue
		}
		g.sleepOnLeft()
	}
	return nil
}
