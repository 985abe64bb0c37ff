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
// The optimizer steps only once every bucket is in (wait): a step whose
// all-reduce failed halfway leaves the weights at the last completed step, which
// a survivor's replica must be. The buckets hold the ranks' sum; the
// optimizer takes the mean as it reads them.
type buckets struct {
	comm   trainer.Reducer
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
	b := &buckets{comm: comm, grads: grads, floats: floats,
		todo: make(chan span, most), done: make(chan error, most)}
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
	if b.handed-lo >= b.floats {
		b.hand(lo)
	}
}

func (b *buckets) hand(lo int) {
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
	var first error
	for ; b.out > 0; b.out-- {
		if err := <-b.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// close stops the reducer; call it after the step's wait.
func (b *buckets) close() { close(b.todo) }
