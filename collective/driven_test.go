package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// allReduceStarted all-reduces buf in pieces, as a trainer's buckets do:
// it starts each piece's all-reduce, moves them along between starts, and
// waits for all.
func allReduceStarted(ctx context.Context, g *Group, buf []float32, pieces int) error {
	for i := range pieces {
		if err := g.StartAllReduce(ctx, buf[i*len(buf)/pieces:(i+1)*len(buf)/pieces]); err != nil {
			return err
		}
		if err := g.Progress(); err != nil {
			return err
		}
	}
	return g.Wait()
}

func randomBuffers(ranks, n int, seed uint64) [][]float32 {
	bufs := make([][]float32, ranks)
	for r := range bufs {
		rng := rand.New(rand.NewPCG(uint64(r), seed))
		bufs[r] = make([]float32, n)
		for i := range bufs[r] {
			bufs[r][i] = float32(rng.NormFloat64() * 10)
		}
	}
	return bufs
}

func sameBits(a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d values against %d", len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Errorf("element %d: %v against %v", i, a[i], b[i])
		}
	}
	return nil
}

// Started all-reduces give AllReduce's sums bit for bit, on every rank,
// whether the caller drives them or they complete at Start: several in
// flight at once, more chunks than the rings have slots (each waits for a
// free one), pieces of every size from empty up.
func TestStartedAllReducesSumAsAllReduceDoes(t *testing.T) {
	for _, world := range []int{2, 3, 4} {
		for _, mode := range []string{ProgressCaller, ProgressNever} {
			t.Run(fmt.Sprintf("ranks=%d/progress=%s", world, mode), func(t *testing.T) {
				const n = 100_003
				// Pieces of 0, 1, 7 floats, then larger ones to the end.
				cuts := []int{0, 0, 1, 8, 1000, 30_000, 70_000, n}
				ref := gang(t, world, Options{ChunkBytes: 4 << 10})
				want := randomBuffers(world, n, 5)
				if err := errors.Join(each(ref, func(r int, g *Group) error {
					for i := 1; i < len(cuts); i++ {
						if err := g.AllReduce(context.Background(), want[r][cuts[i-1]:cuts[i]]); err != nil {
							return err
						}
					}
					return nil
				})...); err != nil {
					t.Fatal(err)
				}
				groups := gang(t, world, Options{ChunkBytes: 4 << 10, Progress: mode, ShmRingBytes: 4 * 4 << 10})
				if got := groups[0].CallerDriven(); got != (mode == ProgressCaller) {
					t.Fatalf("CallerDriven() = %v with Progress %q over shared memory", got, mode)
				}
				got := randomBuffers(world, n, 5)
				errs := each(groups, func(r int, g *Group) error {
					for i := 1; i < len(cuts); i++ {
						if err := g.StartAllReduce(context.Background(), got[r][cuts[i-1]:cuts[i]]); err != nil {
							return err
						}
						if err := g.Progress(); err != nil {
							return err
						}
					}
					return g.Wait()
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				for r := range world {
					if err := sameBits(got[r], want[0]); err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// Any other operation first completes the started ones, in order: ranks
// that start an all-reduce and then call AllReduce, Broadcast or Barrier
// on another buffer get both right.
func TestOtherOperationsWaitForStartedOnes(t *testing.T) {
	const world, n = 3, 50_000
	groups := gang(t, world, Options{ChunkBytes: 8 << 10, Progress: ProgressCaller})
	first, second := randomBuffers(world, n, 1), randomBuffers(world, n, 2)
	want := func(bufs [][]float32) []float32 {
		s := make([]float32, n)
		for i := range s {
			// Each element's sum is made by one rank, in ring order: compare
			// with a tolerance here, bit for bit across ranks below.
			for r := range bufs {
				s[i] += bufs[r][i]
			}
		}
		return s
	}
	w1, w2 := want(first), want(second)
	root := make([][]float32, world)
	errs := each(groups, func(r int, g *Group) error {
		ctx := context.Background()
		if err := g.StartAllReduce(ctx, first[r]); err != nil {
			return err
		}
		if err := g.AllReduce(ctx, second[r]); err != nil {
			return err
		}
		if err := g.StartAllReduce(ctx, first[r][:10]); err != nil {
			return err
		}
		root[r] = []float32{float32(r), 7}
		if err := g.Broadcast(ctx, root[r], 2); err != nil {
			return err
		}
		return g.Barrier(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range world {
		for i := 10; i < n; i++ {
			if d := math.Abs(float64(first[r][i] - w1[i])); d > 1e-3 {
				t.Fatalf("rank %d, first buffer, element %d: %v, want about %v", r, i, first[r][i], w1[i])
			}
		}
		for i := range n {
			if d := math.Abs(float64(second[r][i] - w2[i])); d > 1e-3 {
				t.Fatalf("rank %d, second buffer, element %d: %v, want about %v", r, i, second[r][i], w2[i])
			}
		}
		if err := sameBits(first[r], first[0]); err != nil {
			t.Fatalf("rank %d, first buffer: %v", r, err)
		}
		if err := sameBits(second[r], second[0]); err != nil {
			t.Fatalf("rank %d, second buffer: %v", r, err)
		}
		if root[r][0] != 2 || root[r][1] != 7 {
			t.Fatalf("rank %d: broadcast from rank 2 gave %v", r, root[r])
		}
	}
}

// A started operation moves only when its rank drives it: a rank that
// starts and then computes for a while holds its neighbours up, and they
// complete once it calls Wait, not earlier.
func TestStartedOperationsMoveWhenTheCallerDrivesThem(t *testing.T) {
	const world, n, busy = 2, 1 << 16, 150 * time.Millisecond
	// Chunks of 4 KiB. Rank 1 starts first: its Start sends what the ring
	// takes and returns, as nothing has come from rank 0 yet; then rank 0
	// starts and waits, and cannot finish until rank 1 drives again.
	groups := gang(t, world, Options{ChunkBytes: 4 << 10, Progress: ProgressCaller, ShmRingBytes: 4 * 4 << 10})
	var doneAt [world]time.Duration
	start := time.Now()
	rank1Started := make(chan struct{})
	errs := each(groups, func(r int, g *Group) error {
		buf := make([]float32, n)
		if r == 0 {
			<-rank1Started
		}
		err := g.StartAllReduce(context.Background(), buf)
		if r == 1 {
			close(rank1Started)
		}
		if err != nil {
			return err
		}
		if r == 1 {
			time.Sleep(busy) // computing, and not driving
		}
		err = g.Wait()
		doneAt[r] = time.Since(start)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if doneAt[0] < busy {
		t.Fatalf("rank 0 completed after %v, before rank 1 drove the operation (at %v)", doneAt[0], busy)
	}
}

// A rank whose neighbour closes, or whose own context ends, while it has
// operations started gets the group's error from Wait, and every later
// call fails the same way; nothing is left started.
func TestStartedOperationsFailWithTheGroup(t *testing.T) {
	t.Run("the neighbour closes", func(t *testing.T) {
		groups := gang(t, 3, Options{Progress: ProgressCaller})
		errs := each(groups, func(r int, g *Group) error {
			buf := make([]float32, 1<<18)
			if r == 1 {
				time.Sleep(50 * time.Millisecond)
				g.Close()
				return nil
			}
			for i := range 4 {
				if err := g.StartAllReduce(context.Background(), buf[i<<16:(i+1)<<16]); err != nil {
					return err
				}
			}
			return g.Wait()
		})
		for _, r := range []int{0, 2} {
			var pe *PeerError
			if !errors.As(errs[r], &pe) || pe.Rank != 1 {
				t.Errorf("rank %d: Wait returned %v; want a PeerError naming rank 1", r, errs[r])
			}
			if err := groups[r].Progress(); err == nil {
				t.Errorf("rank %d: Progress after the failure returned nil", r)
			}
			if n := len(groups[r].started); n != 0 {
				t.Errorf("rank %d: %d operations still started", r, n)
			}
		}
	})
	t.Run("the context ends", func(t *testing.T) {
		groups := gang(t, 2, Options{Progress: ProgressCaller})
		var waited time.Duration
		errs := each(groups, func(r int, g *Group) error {
			if r == 1 {
				return nil // never takes part
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if err := g.StartAllReduce(ctx, make([]float32, 1000)); err != nil {
				return err
			}
			start := time.Now()
			err := g.Wait()
			waited = time.Since(start)
			return err
		})
		var pe *PeerError
		if !errors.As(errs[0], &pe) || !strings.Contains(pe.Reason, "cancelled") {
			t.Fatalf("Wait returned %v; want the cancellation", errs[0])
		}
		if waited > 2*time.Second {
			t.Fatalf("Wait returned %v after its context ended at 100ms", waited)
		}
	})
}

func TestWhoDrivesStartedOperations(t *testing.T) {
	for _, tc := range []struct {
		mode         string
		shm          bool
		ranks, cores int
		want         bool
	}{
		{ProgressAuto, true, 2, 2, true},
		{ProgressAuto, true, 4, 2, true},
		{ProgressAuto, true, 2, 16, false}, // a core to spare: a goroutine overlaps for real
		{ProgressAuto, false, 2, 2, false}, // TCP: completes at Start
		{ProgressCaller, true, 2, 16, true},
		{ProgressCaller, false, 2, 2, false},
		{ProgressNever, true, 2, 2, false},
	} {
		if got := callerDriven(tc.mode, tc.shm, tc.ranks, tc.cores); got != tc.want {
			t.Errorf("callerDriven(%q, shm %v, %d ranks, %d cores) = %v; want %v", tc.mode, tc.shm, tc.ranks, tc.cores, got, tc.want)
		}
	}
	groups := gang(t, 2, Options{Transport: TransportTCP, Progress: ProgressCaller})
	if groups[0].CallerDriven() {
		t.Fatal("a group over TCP says the caller drives its operations")
	}
	_, err := Join(context.Background(), listen(t), Gang{Run: "r", Generation: 1, Peers: []string{"a:1", "b:1"}}, 0,
		Options{Secret: testSecret, Progress: "sometimes"})
	if err == nil || !strings.Contains(err.Error(), "options.Progress") || !strings.Contains(err.Error(), `"caller"`) {
		t.Fatalf("Join with Progress %q: %v; want an error naming options.Progress and what it takes", "sometimes", err)
	}
}
