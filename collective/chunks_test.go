package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// Shared-memory links cut segments into ShmChunkBytes, TCP links into
// ChunkBytes, so a rank with one link of each receives a segment in chunks
// of one length and forwards it in chunks of the other: each forward must
// wait for the receipt that completes its last float, never send what has
// not arrived. On rings of every mix (all shared memory, all TCP, pairs of
// ranks sharing an address), with chunk lengths that do not divide one
// another, every rank ends with the ring's sums bit for bit (segment k
// summed from rank k's values on, around the ring), through the ring and
// the small all-reduce; and a broadcast hands every rank the root's buffer.
func TestLinksOfDifferentChunkLengthsSumAsTheRing(t *testing.T) {
	mixes := map[string]func(i int) string{
		"shm":   func(int) string { return "127.0.0.1" },
		"tcp":   func(i int) string { return fmt.Sprintf("127.0.0.%d", i+1) },
		"pairs": func(i int) string { return fmt.Sprintf("127.0.0.%d", i/2+1) },
	}
	opts := Options{ChunkBytes: 1000, ShmChunkBytes: 388} // 250 and 97 floats
	for _, mix := range []string{"shm", "tcp", "pairs"} {
		for _, world := range []int{2, 3, 4, 5} {
			for _, gather := range []int{0, 8192} {
				t.Run(fmt.Sprintf("%s/ranks=%d/gather=%d", mix, world, gather), func(t *testing.T) {
					ips := make([]string, world)
					for i := range ips {
						ips[i] = mixes[mix](i)
					}
					o := opts
					o.GatherBytes = gather
					groups := joinOn(t, ips, o)
					if mix == "pairs" && world >= 3 {
						send, recv := groups[1].Transports()
						if send == recv {
							t.Fatalf("rank 1 sends over %s and receives over %s: the ring mixes nothing", send, recv)
						}
					}
					for _, length := range []int{0, 1, 5, 1003, 30_011} {
						checkRingSums(t, groups, length)
					}
					checkBroadcast(t, groups, 30_011)
				})
			}
		}
	}
}

// checkRingSums all-reduces ringOrderSums's inputs of length floats and
// checks every rank's result against the ring's order bit for bit.
func checkRingSums(t *testing.T, groups []*Group, length int) {
	t.Helper()
	n := len(groups)
	inputs, want := ringOrderSums(n, length, uint64(length))
	bufs := make([][]float32, n)
	for r := range n {
		bufs[r] = slices.Clone(inputs[r])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := errors.Join(each(groups, func(r int, g *Group) error { return g.AllReduce(ctx, bufs[r]) })...); err != nil {
		t.Fatalf("length %d: %v", length, err)
	}
	for r := range n {
		for i := range length {
			if math.Float32bits(bufs[r][i]) != math.Float32bits(want[i]) {
				t.Fatalf("length %d, rank %d, element %d: %v; the ring's order gives %v", length, r, i, bufs[r][i], want[i])
			}
		}
	}
}

// checkBroadcast broadcasts from the last rank, then from the first, and
// checks that every rank holds the root's buffer.
func checkBroadcast(t *testing.T, groups []*Group, length int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, root := range []int{len(groups) - 1, 0} {
		bufs := make([][]float32, len(groups))
		for r := range bufs {
			bufs[r] = make([]float32, length)
			for i := range bufs[r] {
				bufs[r][i] = float32(r*length + i)
			}
		}
		if err := errors.Join(each(groups, func(r int, g *Group) error { return g.Broadcast(ctx, bufs[r], root) })...); err != nil {
			t.Fatalf("broadcast from %d: %v", root, err)
		}
		for r := range bufs {
			if !slices.Equal(bufs[r], bufs[root]) {
				t.Fatalf("broadcast from %d: rank %d holds another buffer", root, r)
			}
		}
		for i, v := range bufs[root] {
			if v != float32(root*length+i) {
				t.Fatalf("broadcast from %d: the root's element %d is %v", root, i, v)
			}
		}
	}
}

// A segment larger than a ring (4 MiB) fills it: every sender waits for
// free slots while its own left neighbour's ring fills too, and each
// drains its left ring while it waits, so the ring of full rings moves on.
// The default chunks and rings, 2 and 3 ranks on one host.
func TestSegmentsLargerThanTheRingsMoveOn(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", world), func(t *testing.T) {
			ips := make([]string, world)
			for i := range ips {
				ips[i] = "127.0.0.1"
			}
			groups := joinOn(t, ips, Options{})
			if send, recv := groups[0].Transports(); send != "shm" || recv != "shm" {
				t.Fatalf("rank 0 sends over %s and receives over %s; want shared memory", send, recv)
			}
			checkRingSums(t, groups, world*(6<<20)/4) // 6 MiB a segment
		})
	}
}
