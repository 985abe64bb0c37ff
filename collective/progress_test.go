package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"
)

// Operations over TCP too large to forward inline run in a progress loop in
// the caller's goroutine (progress.go), where the platform has one: their
// sums are exact and the same on every rank, frames of any size cross reads
// of any size, and small operations and shared-memory links keep their own
// paths.
func TestLargeTCPOperationsRunAProgressLoop(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("progress loops run on Linux")
	}
	for _, tc := range []struct {
		ranks, floats, chunk, cores int
		transport                   string
		progress                    bool
	}{
		{4, 24 << 10, 0, 0, TransportTCP, true},   // 96 KiB: just over inlineSendBytes
		{2, 1 << 18, 0, 0, TransportTCP, true},    // 1 MiB
		{3, 1 << 18, 0, 64, TransportTCP, true},   // through the runtime's poller
		{3, 1 << 18, 0, 1, TransportTCP, true},    // the left link outside it (fdConn)
		{2, 3 << 18, 0, 0, TransportTCP, true},    // 3 MiB: segments of two chunks
		{3, 1 << 18, 4100, 0, TransportTCP, true}, // 1 MiB in frames of 4100 bytes
		{4, 1 << 10, 0, 0, TransportTCP, false},   // 4 KiB: inline
		{2, 1 << 18, 0, 0, TransportAuto, false},  // shared memory
	} {
		name := fmt.Sprintf("%s/ranks=%d/floats=%d/chunk=%d/cores=%d", tc.transport, tc.ranks, tc.floats, tc.chunk, tc.cores)
		t.Run(name, func(t *testing.T) {
			groups := gang(t, tc.ranks, Options{Transport: tc.transport, ChunkBytes: tc.chunk, hostCores: tc.cores})
			for op := range 3 {
				bufs := make([][]float32, tc.ranks)
				for r := range bufs {
					bufs[r] = make([]float32, tc.floats)
					for i := range bufs[r] {
						bufs[r][i] = float32((i*7+r*13+op)%1000) - 500 // sums exact in float32
					}
				}
				errs := each(groups, func(r int, g *Group) error {
					if op == 1 {
						return g.Broadcast(context.Background(), bufs[r], tc.ranks-1)
					}
					return g.AllReduce(context.Background(), bufs[r])
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("operation %d: %v", op, err)
				}
				for i := range tc.floats {
					var want float32
					if op == 1 {
						want = float32((i*7+(tc.ranks-1)*13+op)%1000) - 500
					} else {
						for r := range tc.ranks {
							want += float32((i*7+r*13+op)%1000) - 500
						}
					}
					for r := range tc.ranks {
						if math.Float32bits(bufs[r][i]) != math.Float32bits(want) {
							t.Fatalf("operation %d, rank %d, element %d: got %v, want %v", op, r, i, bufs[r][i], want)
						}
					}
				}
			}
			for r, g := range groups {
				// Every rank receives in each of the 3 operations but the
				// broadcast's root.
				if got := g.progressOps.Load(); tc.progress && got < 2 || !tc.progress && got != 0 {
					t.Errorf("rank %d: %d operations in a progress loop, want them %v", r, got, tc.progress)
				}
			}
		})
	}
}

// A rank waiting in a large operation for a late neighbour, for longer
// than StallTimeout, is kept alive by the keepalives its neighbours send
// between their frames, and reads the ones that arrive among its frames.
func TestALongWaitInALargeOperationIsNotAStall(t *testing.T) {
	const stall = 400 * time.Millisecond
	groups := gang(t, 3, Options{Transport: TransportTCP, StallTimeout: stall})
	errs := each(groups, func(r int, g *Group) error {
		buf := make([]float32, 1<<18)
		for i := range buf {
			buf[i] = float32(r + 1)
		}
		if r == 2 {
			time.Sleep(3 * stall)
		}
		if err := g.AllReduce(context.Background(), buf); err != nil {
			return err
		}
		for i, v := range buf {
			if v != 6 {
				return fmt.Errorf("rank %d element %d: got %v, want 6", r, i, v)
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
