package collective

import (
	"context"
	"fmt"
)

// sendItem is one chunk this rank sends to the right. after is how many of
// the operation's receipts (its items, in order) must be in before it goes:
// 0 for data of this rank's own, more for data received from the left a
// step earlier, up to the receipt that completes the chunk's last float.
// The two links may cut a segment into chunks of different lengths
// (sendPer, recvPer), so a send may wait for several receipts.
type sendItem struct {
	src   []float32
	after int
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
	defer g.abortWhenDone(ctx, job.seq)()
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
		if shm != nil && s.after > 0 {
			if err := shm.await(s.after); err != nil {
				return err
			}
		}
		for shm == nil && tokens < s.after {
			select {
			case <-job.tokens:
				tokens++
			case <-g.done:
				return g.err
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
// receipts, in order.
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
	for first < len(sends) && sends[first].after == 0 {
		first++
	}
	prev := 1
	for _, s := range sends[first:] {
		if s.after < prev || s.after > receipts {
			return 0, false
		}
		prev = s.after
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
	if g.windows != nil {
		if 4*len(buf) <= g.opts.WindowMaxBytes {
			return g.allReduceWindows(ctx, buf)
		}
		if err := g.agreeOnWindows(ctx, opAllReduce, len(buf), 0); err != nil {
			return err
		}
	}
	if g.gathers(len(buf)) {
		if g.skips != nil {
			return g.gatherOverLinks(ctx, buf)
		}
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
	if cap(g.scratch) < min(largest, g.recvPer) {
		g.scratch = make([]float32, min(largest, g.recvPer))
	}
	var sends []sendItem
	var recvs []recvItem
	mod := func(i int) int { return ((i % w) + w) % w }
	// Step t sends segment r-t and receives segment r-t-1, which it adds in
	// for t < w-1 (reduce-scatter: rank r then holds the full sum of segment
	// r+1) and takes as it comes after (all-gather: the summed segments
	// passed around the ring). From step 1 on, what it sends is what it
	// received at step t-1: receipts first+1 to first+count.
	first, count := 0, 0
	for t := range 2 * (w - 1) {
		sends = g.sendChunks(sends, segs[mod(r-t)], first, count)
		first = len(recvs)
		for _, c := range chunksOf(segs[mod(r-t-1)], g.recvPer) {
			recvs = append(recvs, recvItem{dst: c, add: t < w-1})
		}
		count = len(recvs) - first
	}
	return sends, recvs
}

// sendChunks appends the sends of seg, cut into the right link's chunks.
// With count > 0, seg is what arrived in the receipts first+1 to
// first+count, cut into the left link's chunks: each send waits for the
// receipt that completes its last float. With count 0 it waits for nothing.
func (g *Group) sendChunks(sends []sendItem, seg []float32, first, count int) []sendItem {
	end := 0 // floats of seg in the chunks so far
	for _, c := range chunksOf(seg, g.sendPer) {
		end += len(c)
		s := sendItem{src: c}
		if count > 0 {
			// An empty segment is one empty receipt; otherwise the receipt
			// holding float end-1.
			s.after = first + min(count, max(1, (end+g.recvPer-1)/g.recvPer))
		}
		sends = append(sends, s)
	}
	return sends
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
		first, count := 0, 0 // the receipts of the step before
		for s := range w - 1 {
			src := buf
			if s > 0 {
				src = got[(s-1)*n : s*n]
			}
			sends = g.sendChunks(sends, src, first, count)
			first = len(recvs)
			for _, c := range chunksOf(got[s*n:(s+1)*n], g.recvPer) {
				recvs = append(recvs, recvItem{dst: c})
			}
			count = len(recvs) - first
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
	sumInRingOrder(got[(w-1)*n:], w, of)
	copy(buf, got[(w-1)*n:])
	return nil
}

// sumInRingOrder puts into sum the sum of the world's buffers (rank q's is
// of(q)) in the ring's order: segment k from rank k's values, then rank
// k+1's, ... around the ring.
func sumInRingOrder(sum []float32, w int, of func(q int) []float32) {
	n := len(sum)
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
	if g.windows != nil {
		if 4*len(buf) <= g.opts.WindowMaxBytes {
			return g.broadcastWindows(ctx, buf, root)
		}
		if err := g.agreeOnWindows(ctx, opBroadcast, len(buf), root); err != nil {
			return err
		}
	}
	var sends []sendItem
	var recvs []recvItem
	if g.rank != root {
		for _, c := range chunksOf(buf, g.recvPer) {
			recvs = append(recvs, recvItem{dst: c})
		}
	}
	if g.right != root {
		sends = g.sendChunks(sends, buf, 0, len(recvs)) // the root receives none, so waits for none
	}
	return g.run(ctx, opBroadcast, 4*len(buf), sends, recvs)
}

// Barrier returns once every rank has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	return g.AllReduce(ctx, nil)
}

// chunksOf cuts a segment into pipelining units of per floats; an empty
// segment is one empty chunk, so every step of the ring still synchronises
// its two ranks.
func chunksOf(seg []float32, per int) [][]float32 {
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
