package native

import (
	"context"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// The gradient a bucket holds at least when scaling.bucket_bytes is left
// out, and the sizes accepted.
const (
	DefaultBucketBytes = spec.DefaultBucketBytes
	MinBucketBytes     = spec.MinBucketBytes
	MaxBucketBytes     = spec.MaxBucketBytes
)

// buckets all-reduces a step's gradient in pieces, on a goroutine of its own,
// while backward still computes the rest: DDP's overlap of communication with
// computation. Backward completes grads from the end to the start; each time
// at least a bucket's worth is complete and not yet handed over, that range
// is handed to the reducer, and what is left when backward ends is the last
// bucket. A step's buckets are the same on every rank and in every run (they
// follow backward's blocks, which follow the model and the bucket size), so
// the sums, and the weights, stay bit-identical across ranks and runs.
//
// Where the reducer is caller-driven (trainer.CallerDrivenReducer: a host
// whose ranks fill its cores), there is no goroutine: backward's own thread
// starts each bucket's all-reduce as it hands it over and moves the
// started ones along at each of its hooks (ready), and wait drives the
// rest to completion. The sums are the same either way.
//
// The optimizer steps only once every bucket is in (wait): a step whose
// all-reduce failed halfway leaves the weights at the last completed step, which
// a survivor's replica must be. The buckets hold the ranks' sum; the
// optimizer takes the mean as it reads them.
type buckets struct {
	comm   trainer.Reducer
	driven trainer.CallerDrivenReducer // non-nil: all-reduces started and moved by backward's thread
	ctx    context.Context
	err    error // the first error of the step's started all-reduces (driven)
	grads  []float32
	floats int // a bucket holds at least this many floats; the last may hold fewer
	handed int // grads[handed:] is with the reducer this step
	out    int // buckets handed over and not yet waited for
	todo   chan span
	done   chan error
}

type span struct{ lo, hi int }

// newBuckets starts the reducer of a rank's epoch; close stops it.
func newBuckets(ctx context.Context, comm trainer.Reducer, grads []float32, bucketBytes int) *buckets {
	floats := max(1, bucketBytes/4)
	most := len(grads)/floats + 2 // every bucket but the last holds floats or more
	b := &buckets{comm: comm, grads: grads, floats: floats, ctx: ctx}
	if d, ok := comm.(trainer.CallerDrivenReducer); ok && d.CallerDriven() {
		b.driven = d
		return b
	}
	b.todo, b.done = make(chan span, most), make(chan error, most)
	go b.reduce(ctx)
	return b
}

// reduce all-reduces the buckets in the order they come. After a failure
// it reports the same error for the rest without reducing them: the group
// has failed, and the step will not be applied.
func (b *buckets) reduce(ctx context.Context) {
	var failed error
	for s := range b.todo {
		if failed == nil {
			failed = b.comm.AllReduce(ctx, b.grads[s.lo:s.hi])
		}
		b.done <- failed
	}
}

// begin starts a step: nothing of grads is handed over yet.
func (b *buckets) begin() { b.handed = len(b.grads) }

// ready is backward's hook: grads[lo:] is complete.
func (b *buckets) ready(lo int) {
	switch {
	case b.handed-lo >= b.floats:
		b.hand(lo)
	case b.driven != nil && b.err == nil:
		b.err = b.driven.Progress()
	}
}

func (b *buckets) hand(lo int) {
	if b.driven != nil {
		if b.err == nil {
			b.err = b.driven.StartAllReduce(b.ctx, b.grads[lo:b.handed])
		}
		b.handed = lo
		return
	}
	b.todo <- span{lo, b.handed}
	b.handed = lo
	b.out++
}

// wait hands over what backward left and returns once every bucket of the
// step is reduced, with the first error.
func (b *buckets) wait() error {
	if b.handed > 0 {
		b.hand(0)
	}
	if b.driven != nil {
		first := b.err
		b.err = nil
		if err := b.driven.Wait(); first == nil {
			first = err
		}
		return first
	}
	var first error
	for ; b.out > 0; b.out-- {
		if err := <-b.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// close stops the reducer; call it after the step's wait.
func (b *buckets) close() {
	if b.todo != nil {
		close(b.todo)
	}
}
