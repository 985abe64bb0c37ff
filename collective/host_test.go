package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// hostGang starts hosts in-process hosts of perHost ranks each, one listener
// per host as a worker process has, and returns every rank's view by rank.
func hostGang(t testing.TB, hosts, perHost int) ([]*Host, []*HostRank) {
	t.Helper()
	return hostGangWith(t, hosts, perHost, func(int) Options { return Options{} })
}

// hostGangWith is hostGang with each host's ring options (its Secret is the tests').
func hostGangWith(t testing.TB, hosts, perHost int, hostOpts func(host int) Options) ([]*Host, []*HostRank) {
	t.Helper()
	world := hosts * perHost
	lns := make([]*Listener, hosts)
	peers := make([]string, hosts)
	for i := range hosts {
		ln, err := Listen("127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		lns[i], peers[i] = ln, ln.Addr()
	}
	hs := make([]*Host, hosts)
	views := make([]*HostRank, world)
	for i := range hosts {
		h, err := NewHost(i*perHost, perHost, world)
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
		for l := range perHost {
			v, ok := h.Claim(l)
			if !ok {
				t.Fatalf("host %d: local rank %d could not claim its view", i, l)
			}
			views[i*perHost+l] = v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world { // every local rank joins; the host joins once
		wg.Go(func() {
			opts := hostOpts(r / perHost)
			opts.Secret = testSecret
			errs[r] = hs[r/perHost].Join(ctx, lns[r/perHost], Gang{Run: "hosts-" + t.Name(), Generation: 1, Peers: peers}, opts)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d join: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, v := range views {
			v.Close()
		}
	})
	return hs, views
}

func eachView(views []*HostRank, f func(rank int, v *HostRank) error) []error {
	errs := make([]error, len(views))
	var wg sync.WaitGroup
	for i, v := range views {
		wg.Go(func() { errs[i] = f(i, v) })
	}
	wg.Wait()
	return errs
}

func TestHostAllReduceIsBitIdenticalOnEveryRank(t *testing.T) {
	for _, shape := range [][2]int{{1, 2}, {1, 8}, {2, 1}, {2, 4}, {3, 8}, {5, 3}} {
		for _, length := range []int{0, 1, 7, 1003, 300_001} {
			hosts, per := shape[0], shape[1]
			t.Run(fmt.Sprintf("hosts=%d/per=%d/len=%d", hosts, per, length), func(t *testing.T) {
				_, views := hostGang(t, hosts, per)
				world := hosts * per
				bufs := make([][]float32, world)
				want := make([]float64, length)
				rng := rand.New(rand.NewPCG(uint64(world), uint64(length)))
				for r := range bufs {
					bufs[r] = make([]float32, length)
					for i := range bufs[r] {
						bufs[r][i] = float32(rng.NormFloat64())
						want[i] += float64(bufs[r][i])
					}
				}
				for round := range 3 { // reused across operations
					errs := eachView(views, func(r int, v *HostRank) error { return v.AllReduce(context.Background(), bufs[r]) })
					for r, err := range errs {
						if err != nil {
							t.Fatalf("round %d rank %d: %v", round, r, err)
						}
					}
					for r := 1; r < world; r++ {
						for i := range length {
							if math.Float32bits(bufs[r][i]) != math.Float32bits(bufs[0][i]) {
								t.Fatalf("round %d: rank %d element %d is %v, rank 0's %v: not bit-identical", round, r, i, bufs[r][i], bufs[0][i])
							}
						}
					}
					for i := range length {
						if math.Abs(float64(bufs[0][i])-want[i]) > 1e-3*math.Max(1, math.Abs(want[i])) {
							t.Fatalf("round %d element %d: %v, want %v", round, i, bufs[0][i], want[i])
						}
					}
					for i := range want {
						want[i] *= float64(world)
					}
				}
			})
		}
	}
}

func TestHostBroadcastFromEveryRoot(t *testing.T) {
	_, views := hostGang(t, 3, 4)
	for root := range views {
		bufs := make([][]float32, len(views))
		for r := range bufs {
			bufs[r] = []float32{float32(r), float32(r * 10), -1}
		}
		errs := eachView(views, func(r int, v *HostRank) error { return v.Broadcast(context.Background(), bufs[r], root) })
		for r, err := range errs {
			if err != nil {
				t.Fatalf("root %d rank %d: %v", root, r, err)
			}
			if bufs[r][0] != float32(root) || bufs[r][1] != float32(root*10) {
				t.Fatalf("root %d: rank %d has %v", root, r, bufs[r])
			}
		}
	}
	if err := views[0].Broadcast(context.Background(), []float32{1}, len(views)); err == nil {
		t.Fatal("a broadcast from a root outside the gang was accepted")
	}
}

// A local rank that gives up (its context ends) fails its host, and the
// other hosts hear of it through the ring: every rank returns, none waits
// out a timeout, and the others' errors name a rank of the failed host.
func TestHostRankThatStopsFailsTheWholeGang(t *testing.T) {
	_, views := hostGang(t, 3, 4)
	const culprit = 6 // host 1, local rank 2
	start := time.Now()
	errs := eachView(views, func(r int, v *HostRank) error {
		ctx := context.Background()
		if r == culprit {
			c, cancel := context.WithCancel(ctx)
			cancel()
			ctx = c
		}
		return v.AllReduce(ctx, make([]float32, 1000))
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the gang took %v to give up", d)
	}
	for r, err := range errs {
		var pe *PeerError
		if !errors.As(err, &pe) {
			t.Fatalf("rank %d: %v; want a *PeerError", r, err)
		}
		if r/4 == 1 && pe.Rank != culprit {
			t.Errorf("rank %d on the culprit's host blames rank %d; want %d", r, pe.Rank, culprit)
		}
		if r/4 != 1 && pe.Rank/4 != 1 {
			t.Errorf("rank %d blames rank %d, of host %d; want a rank of host 1", r, pe.Rank, pe.Rank/4)
		}
	}
	// A failed host stays failed, and cannot be claimed again.
	if err := views[0].AllReduce(context.Background(), []float32{1}); err == nil {
		t.Error("an operation on a failed host succeeded")
	}
}

// A rank that closes its view while the others of its host wait in an
// operation fails the host instead of leaving them waiting.
func TestHostRankThatClosesReleasesTheOthers(t *testing.T) {
	hs, views := hostGang(t, 1, 3)
	done := make(chan []error)
	go func() {
		done <- eachView(views[:2], func(r int, v *HostRank) error { return v.AllReduce(context.Background(), []float32{1}) })
	}()
	time.Sleep(50 * time.Millisecond)
	views[2].Close()
	select {
	case errs := <-done:
		for r, err := range errs {
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Rank != 2 {
				t.Errorf("rank %d: %v; want a *PeerError naming rank 2", r, err)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the ranks still wait for a rank that closed")
	}
	if _, ok := hs[0].Claim(0); ok {
		t.Error("a failed host handed out a view")
	}
	select {
	case <-hs[0].Done():
	default:
		t.Error("a failed host is not done")
	}
}

// A host whose ring declared it stalled hears its verdict as a flat ring's
// rank does (PeerError.Silence), named by its first rank in the gang, and
// between operations: its ranks fail at once, and the ring's OnFailure is
// told the error they get. Host 1 sends no keepalives (a process off its
// cores would not); host 0 declares it stalled.
func TestAHostDeclaredStalledHearsItsVerdictBetweenOperations(t *testing.T) {
	const stall = 400 * time.Millisecond
	told := make(chan error, 4)
	start := time.Now()
	hs, views := hostGangWith(t, 2, 2, func(host int) Options {
		opts := Options{Transport: TransportTCP, StallTimeout: stall, OnFailure: func(err error) { told <- err }}
		if host == 1 {
			opts.KeepaliveInterval, opts.StallTimeout = time.Hour, time.Hour
		}
		return opts
	})
	for i, h := range hs {
		select {
		case <-h.Done():
		case <-time.After(20 * stall):
			t.Fatalf("host %d: not failed %v after joining, though its ring declared a stall", i, time.Since(start))
		}
	}
	heardAfter := time.Since(start)
	for r, v := range views {
		var pe *PeerError
		if !errors.As(v.Err(), &pe) || pe.Rank != 2 || pe.Reporter != 0 || !pe.Stalled() {
			t.Fatalf("rank %d: %v; want rank 2 (host 1's first) declared stalled by rank 0", r, v.Err())
		}
		if r/2 == 1 && (pe.Silence < stall || pe.Silence > heardAfter) {
			t.Errorf("rank %d: silence %v; want from the stall timeout %v to the %v since the join", r, pe.Silence, stall, heardAfter)
		}
		if r/2 == 0 && pe.Silence != 0 {
			t.Errorf("rank %d, of the accuser's host: silence %v, want none", r, pe.Silence)
		}
	}
	for range 2 {
		select {
		case err := <-told:
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Rank != 2 {
				t.Errorf("OnFailure told %v; want the error naming rank 2", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("OnFailure was not called on both hosts")
		}
	}
	if err := views[3].AllReduce(context.Background(), []float32{1}); !errors.Is(err, views[3].Err()) {
		t.Errorf("an operation after the failure: %v; want the host's error %v", err, views[3].Err())
	}
}

func TestHostOfUnequalLengthsFailsWithAnError(t *testing.T) {
	_, views := hostGang(t, 1, 2)
	errs := eachView(views, func(r int, v *HostRank) error { return v.AllReduce(context.Background(), make([]float32, 3+r)) })
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: unequal lengths were summed", r)
		}
	}
}

func TestNewHostRefusesUnequalHosts(t *testing.T) {
	for _, c := range [][3]int{{0, 0, 4}, {0, 3, 8}, {1, 2, 4}, {4, 2, 4}, {-2, 2, 4}} {
		if _, err := NewHost(c[0], c[1], c[2]); err == nil {
			t.Errorf("NewHost(%d, %d, %d) was accepted", c[0], c[1], c[2])
		}
	}
}

// A host that cannot form its ring names the host it could not reach by
// its first rank in the gang, as every failure of the ring does: the
// worker blames that rank's host, not the rank numbered as the host's index.
func TestAHostThatCannotJoinNamesTheUnreachableHostByItsFirstRank(t *testing.T) {
	lns := []*Listener{listen(t), listen(t)}
	peers := []string{lns[0].Addr(), lns[1].Addr()}
	lns[1].Close() // host 1's worker is gone: its address refuses
	h, err := NewHost(0, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = h.Join(ctx, lns[0], Gang{Run: "unreachable", Generation: 1, Peers: peers}, Options{Secret: testSecret, RefusedTimeout: 200 * time.Millisecond})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 2 || pe.Reporter != 0 {
		t.Fatalf("join: %v (%+v); want a *PeerError naming rank 2, host 1's first, reported by rank 0", err, pe)
	}
}
