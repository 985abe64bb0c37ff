package dataset

import (
	"math/bits"
	"math/rand/v2"
)

// Permutation is the order of n examples in an epoch: a Fisher-Yates shuffle
// driven by PCG seeded with (seed, epoch). It depends on nothing else, so every
// rank, every restart and every Go version computes the same order.
func Permutation(n int, seed uint64, epoch int) []int32 {
	perm := make([]int32, n)
	for i := range perm {
		perm[i] = int32(i)
	}
	rng := rand.NewPCG(seed, uint64(epoch))
	for i := n - 1; i > 0; i-- {
		j := boundedRand(rng, uint64(i+1))
		perm[i], perm[j] = perm[j], perm[i]
	}
	return perm
}

// boundedRand returns a uniform value in [0, n) (Lemire's multiply-and-reject).
func boundedRand(rng *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(rng.Uint64(), n)
	if lo < n {
		threshold := -n % n
		for lo < threshold {
			hi, lo = bits.Mul64(rng.Uint64(), n)
		}
	}
	return hi
}

// ShardSize is the number of examples each of world ranks trains on per epoch:
// n/world, rounded down. The remainder (at most world-1 examples, the last
// ones of that epoch's permutation) sits the epoch out, as with
// DistributedSampler(drop_last=True); since the permutation changes every
// epoch, a different remainder sits out each time.
func ShardSize(n, world int) int { return n / world }

// Shard is the rank's share of an epoch: every world-th example of the
// permutation starting at rank, ShardSize(n, world) of them. Shards of one
// epoch are disjoint and equal-sized, and batch k of every rank together is
// exactly batch k of a single rank with world times the batch size.
func Shard(perm []int32, rank, world int) []int32 {
	size := ShardSize(len(perm), world)
	out := make([]int32, size)
	for i := range out {
		out[i] = perm[rank+i*world]
	}
	return out
}

// EvalRange is the contiguous part [lo, hi) of an n-example evaluation set
// that rank scores; the ranges of all ranks cover every example once.
func EvalRange(n, rank, world int) (lo, hi int) {
	return rank * n / world, (rank + 1) * n / world
}
