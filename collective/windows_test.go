package collective

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// windowGang joins n in-process ranks on one host with host windows and
// checks that they use them.
func windowGang(t *testing.T, n int, opts Options) []*Group {
	t.Helper()
	opts.HostWindows = true
	groups := gang(t, n, opts)
	for r, g := range groups {
		if g.windows == nil {
			t.Fatalf("rank %d of %d on one host runs without host windows", r, n)
		}
	}
	return groups
}

// Through host windows an all-reduce sums as the ring does, bit for bit,
// at every world size, for buffers of every shape: empty, shorter than the
// world, and of many pieces (windows of 4 KiB), segments of unequal
// lengths, and past WindowMaxBytes (around the ring); broadcasts from
// every root and barriers interleave with them.
func TestHostWindowsSumAsTheRingDoes(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(strings.Repeat("r", n), func(t *testing.T) {
			// 10007 floats pass WindowMaxBytes: they go around the ring.
			groups := windowGang(t, n, Options{WindowBytes: 4096, WindowMaxBytes: 16 << 10})
			for _, length := range []int{0, 1, 3, 7, 1003, 10007} {
				inputs := allReduceInRingOrder(t, groups, length, uint64(length*n))
				bufs := make([][]float32, n)
				root := length % n
				for r := range n {
					bufs[r] = slices.Clone(inputs[r])
				}
				for r, err := range each(groups, func(r int, g *Group) error {
					if err := g.Barrier(context.Background()); err != nil {
						return err
					}
					return g.Broadcast(context.Background(), bufs[r], root)
				}) {
					if err != nil {
						t.Fatalf("broadcast of %d from rank %d, rank %d: %v", length, root, r, err)
					}
				}
				for r := range n {
					if !slices.Equal(bufs[r], inputs[root]) {
						t.Fatalf("broadcast of %d from rank %d: rank %d holds other values", length, root, r)
					}
				}
			}
		})
	}
}

// A gang whose ranks cannot all map each other's windows (two hosts) runs
// its ring instead, with the same sums.
func TestHostWindowsOnTwoHostsFallBackToTheRing(t *testing.T) {
	groups := joinOn(t, []string{"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"}, Options{HostWindows: true})
	inputs, want := ringOrderSums(4, 999, 1)
	for r, err := range each(groups, func(r int, g *Group) error {
		if g.windows != nil {
			return errors.New("uses host windows across hosts")
		}
		return g.AllReduce(context.Background(), inputs[r])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range 4 {
		if !slices.Equal(inputs[r], want) {
			t.Fatalf("rank %d: not the ring's sums", r)
		}
	}
}

// Ranks that disagree on HostWindows do not form a gang: Join names the
// neighbour and the option.
func TestRanksThatDisagreeOnHostWindowsFail(t *testing.T) {
	lns := []*Listener{listen(t), listen(t), listen(t)}
	peers := []string{lns[0].Addr(), lns[1].Addr(), lns[2].Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make([]error, 3)
	done := make(chan int, 3)
	for r := range 3 {
		go func() {
			g, err := Join(ctx, lns[r], Gang{Run: "disagree", Generation: 1, Peers: peers}, r, Options{Secret: testSecret, HostWindows: r != 1})
			if err == nil {
				g.Close()
			}
			errs[r] = err
			done <- r
		}()
	}
	for range 3 {
		<-done
	}
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "options.HostWindows") {
			t.Errorf("rank %d: %v; want an error naming options.HostWindows", r, err)
		}
	}
}

// Ranks that call different operations, or the same with different
// lengths, fail with a protocol error rather than wait on each other or
// sum what does not match.
func TestHostWindowsRanksThatDisagreeFailTheOperation(t *testing.T) {
	cases := map[string]func(ctx context.Context, r int, g *Group) error{
		"lengths": func(ctx context.Context, r int, g *Group) error { return g.AllReduce(ctx, make([]float32, 100+r)) },
		"kinds": func(ctx context.Context, r int, g *Group) error {
			if r == 2 {
				return g.Broadcast(ctx, make([]float32, 100), 0)
			}
			return g.AllReduce(ctx, make([]float32, 100))
		},
		"roots": func(ctx context.Context, r int, g *Group) error { return g.Broadcast(ctx, make([]float32, 100), r%2) },
		"one around the ring": func(ctx context.Context, r int, g *Group) error {
			n := 100
			if r == 1 {
				n = 1 << 20 // past WindowMaxBytes
			}
			return g.AllReduce(ctx, make([]float32, n))
		},
		"one broadcasts around the ring": func(ctx context.Context, r int, g *Group) error {
			n := 100
			if r == 3 {
				n = 1 << 20
			}
			return g.Broadcast(ctx, make([]float32, n), 0)
		},
	}
	// Same lengths, but rank 2's WindowMaxBytes sends them around the ring
	// where the others take the windows.
	cases["WindowMaxBytes"] = func(ctx context.Context, r int, g *Group) error {
		if r == 2 {
			g.opts.WindowMaxBytes = 64
		}
		return g.AllReduce(ctx, make([]float32, 100))
	}
	cases["WindowMaxBytes, broadcast"] = func(ctx context.Context, r int, g *Group) error {
		if r == 0 {
			g.opts.WindowMaxBytes = 64
		}
		return g.Broadcast(ctx, make([]float32, 100), 1)
	}
	for name, op := range cases {
		t.Run(name, func(t *testing.T) {
			groups := windowGang(t, 4, Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for r, err := range each(groups, func(r int, g *Group) error {
				if err := op(ctx, r, g); err != nil {
					return err
				}
				return g.AllReduce(ctx, make([]float32, 10))
			}) {
				var pe *PeerError
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), "different orders or with different lengths") {
					t.Errorf("rank %d: %v; want a PeerError for a protocol error", r, err)
				}
			}
		})
	}
}

// A rank that closes its group, or whose caller cancels, while the others
// wait for it at a barrier fails their operation at once, naming it (or
// the cancellation), not at the stall timeout.
func TestHostWindowsPeersWaitingForAClosedOrCancelledRankFail(t *testing.T) {
	for _, how := range []string{"closes", "cancels"} {
		t.Run(how, func(t *testing.T) {
			groups := windowGang(t, 4, Options{StallTimeout: time.Minute})
			start := time.Now()
			errs := each(groups, func(r int, g *Group) error {
				buf := make([]float32, 1<<16)
				if r != 3 {
					return g.AllReduce(context.Background(), buf)
				}
				time.Sleep(100 * time.Millisecond)
				if how == "closes" {
					g.Close()
					return nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return g.AllReduce(ctx, buf)
			})
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("the others took %v to fail", took)
			}
			for r, err := range errs[:3] {
				var pe *PeerError
				if !errors.As(err, &pe) {
					t.Fatalf("rank %d: %v; want a PeerError", r, err)
				}
				if how == "closes" && pe.Rank != 3 {
					t.Errorf("rank %d: %v; want rank 3 named", r, err)
				}
				if how == "cancels" && !strings.Contains(err.Error(), "cancelled") {
					t.Errorf("rank %d: %v; want the cancellation", r, err)
				}
			}
		})
	}
}

// A rank that found a peer failed and closed its group at once (as every
// caller does on an error) makes the ranks waiting for it at a barrier blame
// the peer it found failed, not itself: its window says why it closed, and
// its abort frame over TCP may come after its peers see the window closed.
// (Before, a rank could see the window closed first and blame the closer:
// CI's TestRealPeerFailures, 4 ranks through host windows, kill -9 of rank
// 2, rank 0 blamed rank 1.)
func TestHostWindowsPeersOfARankThatFailedAndClosedBlameTheCulprit(t *testing.T) {
	for round := range 20 {
		groups := windowGang(t, 4, Options{StallTimeout: time.Minute})
		errs := each(groups, func(r int, g *Group) error {
			buf := make([]float32, 1<<12)
			switch r {
			case 1:
				time.Sleep(20 * time.Millisecond) // the others wait at the barrier
				g.blame(2, "the test says rank 2 died")
				g.Close()
				return nil
			case 2:
				return nil // a rank that died does not reach the barrier
			}
			return g.AllReduce(context.Background(), buf)
		})
		for _, r := range []int{0, 3} {
			var pe *PeerError
			if !errors.As(errs[r], &pe) || pe.Rank != 2 || pe.Reporter != 1 || !strings.Contains(pe.Reason, "the test says rank 2 died") {
				t.Fatalf("round %d: rank %d: %v; want rank 2 named, as rank 1 found it", round, r, errs[r])
			}
		}
		for _, g := range groups {
			g.Close()
		}
	}
}

// WindowBytes out of range is refused, naming the option and what it takes.
func TestWindowBytesOutOfRangeIsRefused(t *testing.T) {
	for _, bad := range []int{1, 4095, 4098, 2 << 30} {
		_, err := Join(context.Background(), listen(t), Gang{Run: "w", Generation: 1, Peers: []string{"127.0.0.1:1", "127.0.0.1:2"}}, 0,
			Options{Secret: testSecret, HostWindows: true, WindowBytes: bad})
		if err == nil || !strings.Contains(err.Error(), "options.WindowBytes") {
			t.Errorf("WindowBytes %d: %v; want it refused by name", bad, err)
		}
	}
}

// A /dev/shm too small for every ring and window (a container's is often
// 64 MiB) refuses what does not fit when it is made: those links run over
// TCP, the gang runs its ring, and the sums are right. Pages of shared
// memory only reserved, not allocated, would kill the process with SIGBUS
// when first written (as they did before 0.6.0). The test reruns itself in
// a mount namespace with a 6 MiB /dev/shm, which needs root.
func TestAFullDevShmRefusesRingsAndWindows(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	if os.Getenv("DT_SMALL_SHM") == "" {
		if os.Geteuid() != 0 {
			t.Skip("mounting a small /dev/shm needs root")
		}
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("no unshare(1)")
		}
		cmd := exec.Command("unshare", "-m", "sh", "-c",
			`mount -t tmpfs -o size=6m tmpfs /dev/shm || exit 77; exec "$0" -test.run '^TestAFullDevShmRefusesRingsAndWindows$' -test.count=1 -test.v`, os.Args[0])
		cmd.Env = append(os.Environ(), "DT_SMALL_SHM=1")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 77 || strings.Contains(string(out), "unshare failed") {
			t.Skipf("cannot mount a small /dev/shm here: %s", out)
		}
		if err != nil || !strings.Contains(string(out), "--- PASS: TestAFullDevShmRefusesRingsAndWindows") {
			t.Fatalf("in a 6 MiB /dev/shm: %v\n%s", err, out)
		}
		t.Logf("%s", out)
		return
	}
	groups := gang(t, 4, Options{HostWindows: true})
	tcp := 0
	for r, g := range groups {
		if g.windows != nil {
			t.Fatalf("rank %d has host windows in a /dev/shm with room for one ring", r)
		}
		if send, _ := g.Transports(); send == "tcp" {
			tcp++
		}
	}
	if tcp == 0 {
		t.Fatal("every link is shared memory in a /dev/shm with room for one ring")
	}
	for op := range 5 {
		inputs, want := ringOrderSums(4, 1<<18, uint64(op))
		for r, err := range each(groups, func(r int, g *Group) error { return g.AllReduce(context.Background(), inputs[r]) }) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		for r := range 4 {
			if !slices.Equal(inputs[r], want) {
				t.Fatalf("operation %d, rank %d: not the ring's sums", op, r)
			}
		}
	}
	t.Logf("%d of 4 links over TCP", tcp)
}
