package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

var testSecret = []byte("0123456789abcdef-test-secret")

// gang starts n in-process ranks on loopback and joins them.
func gang(t testing.TB, n int, opts Options) []*Group {
	t.Helper()
	ips := make([]string, n)
	for i := range ips {
		ips[i] = "127.0.0.1"
	}
	return joinAt(t, ips, opts)
}

// joinOn joins one rank per address in ips (127.0.0.x), with
// TransportSameIP: ranks on one address talk through shared memory, the
// others over TCP.
func joinOn(t testing.TB, ips []string, opts Options) []*Group {
	t.Helper()
	opts.Transport = TransportSameIP
	return joinAt(t, ips, opts)
}

// joinAt starts one in-process rank listening on each address in ips
// (any port) and joins them; the groups close when the test ends.
func joinAt(t testing.TB, ips []string, opts Options) []*Group {
	t.Helper()
	if opts.Secret == nil {
		opts.Secret = testSecret
	}
	lns := make([]*Listener, len(ips))
	peers := make([]string, len(ips))
	for i, ip := range ips {
		ln, err := Listen(ip+":0", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		lns[i], peers[i] = ln, ln.Addr()
	}
	groups := make([]*Group, len(ips))
	errs := make([]error, len(ips))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range ips {
		wg.Go(func() {
			groups[i], errs[i] = Join(ctx, lns[i], Gang{Run: "run-" + t.Name(), Generation: 1, Peers: peers}, i, opts)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, g := range groups {
			if g != nil {
				g.Close()
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d join: %v", i, err)
		}
	}
	return groups
}

// ringOrderSums makes n ranks' inputs of length floats, spanning
// magnitudes so that another order of additions shows, and their sums in
// the ring's order, written out: segment k summed from rank k's values on,
// around the ring.
func ringOrderSums(n, length int, seed uint64) (inputs [][]float32, want []float32) {
	inputs = make([][]float32, n)
	for r := range n {
		rng := rand.New(rand.NewPCG(uint64(r), seed))
		inputs[r] = make([]float32, length)
		for i := range inputs[r] {
			inputs[r][i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)-6)))
		}
	}
	want = make([]float32, length)
	for k := range n {
		for i := k * length / n; i < (k+1)*length/n; i++ {
			acc := inputs[k][i]
			for j := 1; j < n; j++ {
				acc += inputs[(k+j)%n][i]
			}
			want[i] = acc
		}
	}
	return inputs, want
}

// allReduceInRingOrder all-reduces copies of ringOrderSums' inputs on
// every rank of groups and fails the test unless each rank holds the
// ring's sums, bit for bit; it returns the inputs.
func allReduceInRingOrder(t *testing.T, groups []*Group, length int, seed uint64) [][]float32 {
	t.Helper()
	n := len(groups)
	inputs, want := ringOrderSums(n, length, seed)
	bufs := make([][]float32, n)
	for r := range n {
		bufs[r] = slices.Clone(inputs[r])
	}
	for r, err := range each(groups, func(r int, g *Group) error { return g.AllReduce(context.Background(), bufs[r]) }) {
		if err != nil {
			t.Fatalf("length %d, rank %d: %v", length, r, err)
		}
	}
	for r := range n {
		for i := range length {
			if math.Float32bits(bufs[r][i]) != math.Float32bits(want[i]) {
				t.Fatalf("length %d, rank %d, element %d: %v; the ring's order gives %v", length, r, i, bufs[r][i], want[i])
			}
		}
	}
	return inputs
}

// each runs f on every rank concurrently and returns the errors by rank.
func each(groups []*Group, f func(rank int, g *Group) error) []error {
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { errs[i] = f(i, g) })
	}
	wg.Wait()
	return errs
}

func TestAllReduceSumsExactlyOnEveryRank(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7} {
		for _, length := range []int{0, 1, n - 1, 1003, 1_000_003} {
			for _, chunk := range []int{0, 4096} {
				if length > 100_000 && chunk != 0 {
					continue
				}
				t.Run(fmt.Sprintf("ranks=%d/len=%d/chunk=%d", n, length, chunk), func(t *testing.T) {
					groups := gang(t, n, Options{ChunkBytes: chunk})
					bufs := make([][]float32, n)
					want := make([]float64, length)
					scale := make([]float64, length)
					for r := range n {
						rng := rand.New(rand.NewPCG(uint64(r), uint64(length)))
						bufs[r] = make([]float32, length)
						for i := range bufs[r] {
							v := float32(rng.NormFloat64() * 100)
							bufs[r][i] = v
							want[i] += float64(v)
							scale[i] += math.Abs(float64(v))
						}
					}
					for r, err := range each(groups, func(r int, g *Group) error {
						return g.AllReduce(context.Background(), bufs[r])
					}) {
						if err != nil {
							t.Fatalf("rank %d: %v", r, err)
						}
					}
					for i := range length {
						if d := math.Abs(float64(bufs[0][i]) - want[i]); d > 1e-6*scale[i]*float64(n) {
							t.Fatalf("element %d: got %v, want %v (diff %g)", i, bufs[0][i], want[i], d)
						}
						for r := 1; r < n; r++ {
							if math.Float32bits(bufs[r][i]) != math.Float32bits(bufs[0][i]) {
								t.Fatalf("element %d: rank %d has %v, rank 0 has %v: not bitwise identical", i, r, bufs[r][i], bufs[0][i])
							}
						}
					}
				})
			}
		}
	}
}

func TestManyOperationsInSequence(t *testing.T) {
	groups := gang(t, 3, Options{ChunkBytes: 64})
	for step := range 50 {
		length := step * 7
		errs := each(groups, func(r int, g *Group) error {
			buf := make([]float32, length)
			for i := range buf {
				buf[i] = float32(r + i)
			}
			if err := g.AllReduce(context.Background(), buf); err != nil {
				return err
			}
			for i := range buf {
				if want := float32(3*i + 3); buf[i] != want {
					return fmt.Errorf("step %d element %d: got %v want %v", step, i, buf[i], want)
				}
			}
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBroadcastFromEveryRoot(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		groups := gang(t, n, Options{ChunkBytes: 1024})
		for root := range n {
			length := 5000 + root
			errs := each(groups, func(r int, g *Group) error {
				buf := make([]float32, length)
				if r == root {
					for i := range buf {
						buf[i] = float32(i*10 + root)
					}
				}
				if err := g.Broadcast(context.Background(), buf, root); err != nil {
					return err
				}
				for i := range buf {
					if buf[i] != float32(i*10+root) {
						return fmt.Errorf("rank %d element %d: got %v", r, i, buf[i])
					}
				}
				return nil
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("ranks=%d root=%d: %v", n, root, err)
			}
		}
	}
}

func TestBarrierWaitsForTheLastRank(t *testing.T) {
	groups := gang(t, 4, Options{})
	var entered atomic.Int32
	errs := each(groups, func(r int, g *Group) error {
		time.Sleep(time.Duration(r) * 30 * time.Millisecond)
		entered.Add(1)
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		if got := entered.Load(); got != 4 {
			return fmt.Errorf("rank %d left the barrier when only %d ranks had entered", r, got)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// Both transports: over TCP a small operation's forwards are sent by the
// left reader (run), and its failures must reach the caller all the same.
func TestMismatchedLengthsFailOnBothRanks(t *testing.T) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		for _, floats := range []int{10, 1 << 18} {
			t.Run(fmt.Sprintf("%s/%d", transport, floats), func(t *testing.T) {
				groups := gang(t, 2, Options{Transport: transport})
				errs := each(groups, func(r int, g *Group) error {
					return g.AllReduce(context.Background(), make([]float32, floats+2*r))
				})
				for r, err := range errs {
					if err == nil || !strings.Contains(err.Error(), "different lengths") {
						t.Errorf("rank %d: got %v, want a protocol error about different lengths", r, err)
					}
				}
			})
		}
	}
}

func TestCancelledRankAbortsTheGroup(t *testing.T) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		for _, floats := range []int{100, 1 << 18} {
			t.Run(fmt.Sprintf("%s/%d", transport, floats), func(t *testing.T) {
				testCancelledRankAbortsTheGroup(t, transport, floats)
			})
		}
	}
}

// testCancelledRankAbortsTheGroup: rank 0's context ends while it waits in
// an operation that rank 2 has not begun; every rank returns the abort, and
// rank 0 at once (its wait in a link wakes).
func testCancelledRankAbortsTheGroup(t *testing.T, transport string, floats int) {
	groups := gang(t, 3, Options{Transport: transport})
	var cancelledAfter time.Duration
	errs := each(groups, func(r int, g *Group) error {
		switch r {
		case 0:
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := g.AllReduce(ctx, make([]float32, floats))
			cancelledAfter = time.Since(start)
			return err
		case 1:
			return g.AllReduce(context.Background(), make([]float32, floats))
		default: // rank 2 is late; by then the group is aborted
			time.Sleep(time.Second)
			return g.AllReduce(context.Background(), make([]float32, floats))
		}
	})
	if cancelledAfter > 2*time.Second {
		t.Errorf("rank 0 returned %v after its operation began; its context ended after 200ms", cancelledAfter)
	}
	for r, err := range errs {
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Reporter != 0 || pe.Rank != -1 {
			t.Errorf("rank %d: got %v, want an abort reported by rank 0", r, err)
		}
	}
}

func TestWrongSecretIsRefused(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	lns := []*Listener{}
	peers := []string{}
	for range 2 {
		ln, err := Listen("127.0.0.1:0", zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns, peers = append(lns, ln), append(peers, ln.Addr())
	}
	secrets := [][]byte{testSecret, []byte("another-secret-of-16-bytes")}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			g, err := Join(ctx, lns[r], Gang{Run: "r", Generation: 1, Peers: peers}, r, Options{Secret: secrets[r]})
			if g != nil {
				g.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d joined a gang whose other rank has a different secret", r)
		}
	}
	if !errors.Is(errs[0], errAuth) && !errors.Is(errs[1], errAuth) {
		t.Errorf("want an authentication error, got %v / %v", errs[0], errs[1])
	}
	// The acceptor logs when the dialer hangs up on it: after the Joins returned.
	for deadline := time.Now().Add(2 * time.Second); logs.FilterMessage("collective connection refused").Len() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if logs.FilterMessage("collective connection refused").Len() == 0 {
		t.Errorf("the refused connection was not logged")
	}
}

func TestStrangerConnectionIsRefusedAndTheGangStillForms(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	ln, err := Listen("127.0.0.1:0", zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ln2, _ := Listen("127.0.0.1:0", nil)
	defer ln2.Close()
	// A stranger speaks the protocol but does not know the secret.
	go func() {
		c, err := dialTCP(ln.Addr())
		if err == nil {
			dialHandshake(context.Background(), c, []byte("i-do-not-know-the-secret"), hello{Run: "r", Generation: 1, From: 1, To: 0, World: 2})
			c.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	peers := []string{ln.Addr(), ln2.Addr()}
	var groups [2]*Group
	var errs [2]error
	var wg sync.WaitGroup
	for r, l := range []*Listener{ln, ln2} {
		wg.Go(func() {
			groups[r], errs[r] = Join(ctx, l, Gang{Run: "r", Generation: 1, Peers: peers}, r, Options{Secret: testSecret})
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	defer groups[0].Close()
	defer groups[1].Close()
	// The listener logs when the stranger hangs up: possibly after the joins returned.
	for deadline := time.Now().Add(2 * time.Second); logs.FilterMessage("collective connection refused").Len() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if logs.FilterMessage("collective connection refused").Len() == 0 {
		t.Errorf("the stranger's connection was not logged as refused")
	}
	buf0, buf1 := []float32{1, 2}, []float32{10, 20}
	errs2 := each(groups[:], func(r int, g *Group) error { return g.AllReduce(ctx, [][]float32{buf0, buf1}[r]) })
	if err := errors.Join(errs2...); err != nil || buf0[1] != 22 {
		t.Fatalf("after refusing the stranger: err %v, sum %v", err, buf0)
	}
}

func TestStaleGenerationIsNeverConnected(t *testing.T) {
	lns := []*Listener{}
	peers := []string{}
	for range 2 {
		ln, _ := Listen("127.0.0.1:0", nil)
		defer ln.Close()
		lns, peers = append(lns, ln), append(peers, ln.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var joined atomic.Int32
	for r := range 2 {
		wg.Go(func() {
			g, err := Join(ctx, lns[r], Gang{Run: "r", Generation: uint64(r + 1), Peers: peers}, r, Options{Secret: testSecret})
			if err == nil {
				joined.Add(1)
				g.Close()
			}
		})
	}
	wg.Wait()
	if joined.Load() != 0 {
		t.Fatal("ranks of different generations formed a group")
	}
}

func TestJoinRejectsBadInput(t *testing.T) {
	ln, _ := Listen("127.0.0.1:0", nil)
	defer ln.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		gang Gang
		rank int
		opts Options
		want string
	}{
		{Gang{Run: "r"}, 0, Options{Secret: testSecret}, "Peers is empty"},
		{Gang{Run: "r", Peers: []string{"a", "b"}}, 2, Options{Secret: testSecret}, "rank 2 out of range"},
		{Gang{Peers: []string{"a"}}, 0, Options{Secret: testSecret}, "gang.Run"},
		{Gang{Run: "r", Peers: []string{"a"}}, 0, Options{Secret: []byte("short")}, "Secret has 5 bytes"},
	} {
		if _, err := Join(ctx, ln, tc.gang, tc.rank, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Join(%+v, rank %d): got %v, want an error containing %q", tc.gang, tc.rank, err, tc.want)
		}
	}
}

// TestClosingAfterTheLastOperationDoesNotFailTheNeighbour: a rank that
// finishes and closes at once must not turn its neighbour's completed
// operation into an error, whichever connection the close notice arrives on first.
func TestClosingAfterTheLastOperationDoesNotFailTheNeighbour(t *testing.T) {
	for _, world := range []int{2, 4} {
		for i := range 8 {
			groups := gang(t, world, Options{})
			errs := each(groups, func(r int, g *Group) error {
				// Large enough that a neighbour is still reading or sending its
				// last chunks when a rank that is done closes.
				if err := g.AllReduce(context.Background(), make([]float32, 1<<22)); err != nil {
					return err
				}
				err := g.Barrier(context.Background())
				g.Close()
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("%d ranks, round %d: %v", world, i, err)
			}
		}
	}
}

func TestTransportsAgreeBitForBit(t *testing.T) {
	sums := map[string][]float32{}
	for _, transport := range []string{TransportAuto, TransportTCP} {
		// Rings of 4 slots: more chunks than slots, so that senders wait for free ones.
		groups := gang(t, 3, Options{Transport: transport, ChunkBytes: 64 << 10, ShmRingBytes: 4 * 64 << 10})
		send, recv := groups[0].Transports()
		want := "shm"
		if transport == TransportTCP {
			want = "tcp"
		}
		if send != want || recv != want {
			t.Fatalf("transport %q: rank 0 sends over %s, receives over %s; want %s", transport, send, recv, want)
		}
		bufs := make([][]float32, 3)
		errs := each(groups, func(r int, g *Group) error {
			bufs[r] = make([]float32, 300_001)
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for i := range bufs[r] {
				bufs[r][i] = float32(rng.NormFloat64())
			}
			for range 3 { // more chunks than slots, several times over
				if err := g.AllReduce(context.Background(), bufs[r]); err != nil {
					return err
				}
			}
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		sums[want] = bufs[2]
	}
	for i := range sums["shm"] {
		if math.Float32bits(sums["shm"][i]) != math.Float32bits(sums["tcp"][i]) {
			t.Fatalf("element %d: %v over shared memory, %v over TCP", i, sums["shm"][i], sums["tcp"][i])
		}
	}
}

// TransportSameIP uses shared memory only between neighbours whose listeners
// share an IP address: simulated hosts on 127.0.0.x talk TCP to each other.
func TestTransportSameIPKeepsHostsApart(t *testing.T) {
	ips := []string{"127.0.0.1", "127.0.0.2", "127.0.0.2"}
	groups := joinOn(t, ips, Options{ChunkBytes: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Ring 0 -> 1 -> 2 -> 0: only 1 -> 2 stays on one address.
	for r, want := range [][2]string{{"tcp", "tcp"}, {"shm", "tcp"}, {"tcp", "shm"}} {
		if send, recv := groups[r].Transports(); send != want[0] || recv != want[1] {
			t.Errorf("rank %d sends over %s and receives over %s; want %s and %s", r, send, recv, want[0], want[1])
		}
	}
	bufs := [][]float32{make([]float32, 100_000), make([]float32, 100_000), make([]float32, 100_000)}
	if err := errors.Join(each(groups, func(r int, g *Group) error {
		for i := range bufs[r] {
			bufs[r][i] = float32(r + 1)
		}
		return g.AllReduce(ctx, bufs[r])
	})...); err != nil {
		t.Fatal(err)
	}
	if bufs[0][99_999] != 6 || bufs[2][0] != 6 {
		t.Fatalf("sums %v, %v; want 6", bufs[0][99_999], bufs[2][0])
	}
}

// A small all-reduce gathers every rank's buffer and sums them as the ring
// would: every rank's result is, bit for bit, the ring's (segment k summed
// from rank k's values on, around the ring), over both transports, so an
// operation's path changes its speed and never its sums. The inputs span
// magnitudes, so that a different order of additions shows.
func TestSmallAllReduceSumsAsTheRingDoes(t *testing.T) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		// Over TCP, 3 ranks and more gather over skip links (skiplinks.go):
		// 6 has a last step that sends fewer blocks than it holds, 8 three
		// steps.
		for _, n := range []int{2, 3, 4, 5, 6, 8} {
			t.Run(fmt.Sprintf("%s/ranks=%d", transport, n), func(t *testing.T) {
				const length = 1003
				inputs, want := ringOrderSums(n, length, 7)
				got := map[int][][]float32{}
				for _, gather := range []int{64 << 10, 0} {
					groups := gang(t, n, Options{Transport: transport, GatherBytes: gather, GatherLinks: transport == TransportTCP, ChunkBytes: 1024})
					bufs := make([][]float32, n)
					for r := range n {
						bufs[r] = slices.Clone(inputs[r])
					}
					for r, err := range each(groups, func(r int, g *Group) error {
						// Two ranks over shared memory take the ring (gathers).
						want := gather > 0 && !(n == 2 && g.recvRing != nil)
						if g.gathers(length) != want {
							t.Errorf("rank %d: gathers(%d) = %v with GatherBytes %d, want %v", r, length, g.gathers(length), gather, want)
						}
						if links := gather > 0 && n >= 3 && transport == TransportTCP; (g.skips != nil) != links {
							t.Errorf("rank %d: %d skip links with GatherBytes %d over %q; want them: %v", r, len(g.skips), gather, transport, links)
						}
						return g.AllReduce(context.Background(), bufs[r])
					}) {
						if err != nil {
							t.Fatalf("gather %d, rank %d: %v", gather, r, err)
						}
					}
					got[gather] = bufs
				}
				for gather, bufs := range got {
					for r := range n {
						for i := range length {
							if math.Float32bits(bufs[r][i]) != math.Float32bits(want[i]) {
								t.Fatalf("GatherBytes %d, rank %d, element %d: %v; the ring's order gives %v", gather, r, i, bufs[r][i], want[i])
							}
						}
					}
				}
				// The order matters for these inputs: rank order differs somewhere.
				differs := false
				for i := range length {
					var acc float32
					for r := range n {
						acc += inputs[r][i]
					}
					differs = differs || acc != want[i]
				}
				if n > 2 && !differs {
					t.Fatal("the inputs sum the same in rank order and in the ring's: the test shows nothing")
				}
			})
		}
	}
}

// Ranks that disagree on the small all-reduce's bound fail with a protocol
// error on every rank instead of summing different things.
func TestRanksThatDisagreeOnGatherBytesFail(t *testing.T) {
	// (Two ranks over shared memory never gather: gathers.)
	for _, tc := range []struct {
		ranks     int
		transport string
	}{{2, TransportTCP}, {3, TransportAuto}} {
		groups := gang(t, tc.ranks, Options{GatherBytes: 64 << 10, Transport: tc.transport})
		groups[1].opts.GatherBytes = 0
		errs := each(groups, func(r int, g *Group) error {
			return g.AllReduce(context.Background(), make([]float32, 100))
		})
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "protocol error") {
				t.Errorf("%d ranks over %q, rank %d: got %v, want a protocol error", tc.ranks, tc.transport, r, err)
			}
		}
	}
}

// Plans are kept per buffer: buffers taken in turn, one a prefix of
// another, and more buffers than are kept, each still sum right.
func TestPlansFollowTheirBuffers(t *testing.T) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		t.Run(transport, func(t *testing.T) {
			groups := gang(t, 3, Options{Transport: transport, ChunkBytes: 64})
			for _, buffers := range []int{4, maxPlans + 6} { // plans kept, then more than are kept
				bufs := make([][][]float32, len(groups)) // rank, buffer
				for r := range bufs {
					bufs[r] = make([][]float32, buffers)
					for i := range bufs[r] {
						bufs[r][i] = make([]float32, 40)
					}
				}
				for round := range 3 {
					for i := range buffers {
						length := 40
						if (i+round)%2 == 1 {
							length = 17 // a prefix of the same buffer, from round to round: a plan of its own
						}
						for r, err := range each(groups, func(r int, g *Group) error {
							b := bufs[r][i][:length]
							for j := range b {
								b[j] = float32(r*1000 + i*10 + j + round)
							}
							return g.AllReduce(context.Background(), b)
						}) {
							if err != nil {
								t.Fatalf("round %d buffer %d rank %d: %v", round, i, r, err)
							}
						}
						for j := range length {
							want := float32(3*(i*10+j+round) + 1000 + 2000)
							for r := range groups {
								if got := bufs[r][i][j]; got != want {
									t.Fatalf("round %d buffer %d element %d rank %d: got %v, want %v", round, i, j, r, got, want)
								}
							}
						}
					}
				}
			}
		})
	}
}

// TestSmallTCPOperationsReadAndForwardThemselves pins which operations readLeft
// forwards itself (run): those over TCP that send at most inlineSendBytes in
// all, which the sockets' buffers hold even when the right neighbour stops
// reading; the rest keep the operation's goroutine as the sender, which
// overlaps sending with receiving.
func TestSmallTCPOperationsReadAndForwardThemselves(t *testing.T) {
	for _, tc := range []struct {
		ranks, floats int
		want          bool
	}{
		{2, 1 << 10, true},  // 4 KiB: 4 KiB sent in all
		{4, 1 << 10, true},  // 4 KiB: 6 KiB
		{2, 1 << 14, true},  // 64 KiB: 64 KiB
		{4, 1 << 14, false}, // 64 KiB: 96 KiB, more than inlineSendBytes
		{4, 1 << 18, false}, // 1 MiB
		{4, 0, true},        // a barrier
	} {
		g := gang(t, tc.ranks, Options{Transport: TransportTCP})[0]
		sends, recvs := g.ringPlan(make([]float32, tc.floats))
		first, ok := g.forwardsInline(sends, len(recvs))
		if ok != tc.want {
			t.Errorf("%d ranks, %d floats: read and forwarded by the operation %v, want %v", tc.ranks, tc.floats, ok, tc.want)
		}
		if ok && first != 1 {
			t.Errorf("%d ranks, %d floats: %d sends before the first forward, want 1 (this rank's own segment)", tc.ranks, tc.floats, first)
		}
	}
}

// A right neighbour whose address refuses connections (its process is
// gone) fails the join with a PeerError naming it once RefusedTimeout has
// passed; without RefusedTimeout the join waits on, as for a listener
// still starting, until its context ends.
func TestJoinGivesUpOnARefusingNeighbourAfterRefusedTimeout(t *testing.T) {
	ln := listen(t)
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := gone.Addr().String()
	gone.Close() // nothing listens there now: connections are refused
	peers := []string{ln.Addr(), dead}
	for _, refused := range []time.Duration{200 * time.Millisecond, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		_, err := Join(ctx, ln, Gang{Run: "refused", Generation: 1, Peers: peers}, 0, Options{Secret: testSecret, RefusedTimeout: refused})
		took := time.Since(start)
		cancel()
		var pe *PeerError
		switch {
		case refused > 0 && (!errors.As(err, &pe) || pe.Rank != 1 || pe.Reporter != 0 || !strings.Contains(pe.Reason, "refused")):
			t.Fatalf("RefusedTimeout %v: %v; want a PeerError naming rank 1", refused, err)
		case refused > 0 && took > 2*time.Second:
			t.Fatalf("RefusedTimeout %v: gave up after %v", refused, took)
		case refused == 0 && (errors.As(err, &pe) || !errors.Is(err, context.DeadlineExceeded)):
			t.Fatalf("no RefusedTimeout: %v; want the context's deadline", err)
		}
	}
}

// The left link changes hands between the operations that read it and
// readLeft, which reads it once no operation has for leftIdleGap. Ranks
// pause longer than that between operations, together and one at a time,
// so that data arrives before its operation began (readLeft keeps its
// header) and operations take the link back from readLeft while it waits in
// a read; small operations (read by their own goroutine) and large ones
// (read by readLeft) alternate, keepalives arrive throughout, and every sum
// must still be exact, through the runtime's poller and outside it.
func TestTheLeftLinkChangesHandsBetweenOperations(t *testing.T) {
	const world = 3
	for _, cores := range []int{64, 1} {
		groups := gang(t, world, Options{Transport: TransportTCP, GatherBytes: 16 << 10, ChunkBytes: 16 << 10,
			KeepaliveInterval: 2 * time.Millisecond, hostCores: cores})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		value := func(rank, step, i int) float32 { return float32(rank*1000 + step + i%7) }
		errs := each(groups, func(r int, g *Group) error {
			for step := range 24 {
				switch {
				case step%4 == 1: // all pause; rank 0 longest, so its right neighbour takes the link back
					pause := 3 * leftIdleGap
					if r == 0 {
						pause *= 2
					}
					time.Sleep(pause)
				case step%4 == 3 && r == step/4%world: // one pauses: its left neighbour's data waits for it
					time.Sleep(3 * leftIdleGap)
				}
				buf := make([]float32, []int{1 << 10, 1 << 16, 0, 5}[step/2%4])
				for i := range buf {
					buf[i] = value(r, step, i)
				}
				if err := g.AllReduce(ctx, buf); err != nil {
					return fmt.Errorf("operation %d: %w", step, err)
				}
				for i, got := range buf {
					var want float32
					for q := range world {
						want += value(q, step, i)
					}
					if got != want {
						return fmt.Errorf("operation %d, element %d: got %v, want %v", step, i, got, want)
					}
				}
			}
			return nil
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("host cores %d: %v", cores, err)
		}
		var taken, early int64
		for _, g := range groups {
			taken += g.leftTaken.Load()
			early += g.leftEarly.Load()
		}
		t.Logf("host cores %d: %d operations took the link from readLeft, %d data frames came before their operation", cores, taken, early)
		if taken == 0 || early == 0 {
			t.Errorf("host cores %d: the test did not exercise the hand-over (%d taken, %d early)", cores, taken, early)
		}
	}
}

// A left neighbour that closes its group between operations fails nothing
// while this rank does not expect data from it: readLeft reads the close
// while no operation runs. The next operation that expects data fails,
// naming it.
func TestALeftNeighbourClosedBetweenOperationsFailsTheNextOne(t *testing.T) {
	for _, cores := range []int{64, 1} {
		groups := gang(t, 3, Options{Transport: TransportTCP, GatherBytes: 16 << 10, hostCores: cores})
		ctx := context.Background()
		if err := errors.Join(each(groups, func(r int, g *Group) error { return g.Barrier(ctx) })...); err != nil {
			t.Fatal(err)
		}
		groups[0].Close()
		time.Sleep(4 * leftIdleGap) // readLeft reads the close
		if err := groups[1].Err(); err != nil {
			t.Fatalf("host cores %d: rank 1 failed before any operation: %v", cores, err)
		}
		groups[1].leftMu.Lock()
		ended := groups[1].leftRd.ended
		groups[1].leftMu.Unlock()
		if !ended {
			t.Fatalf("host cores %d: rank 1 has not read its left neighbour's close", cores)
		}
		err := groups[1].AllReduce(ctx, make([]float32, 8))
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != 0 {
			t.Fatalf("host cores %d: got %v, want a PeerError naming rank 0", cores, err)
		}
	}
}

// Silence from the left neighbour is counted from its last frame, whoever
// reads the link: readLeft between operations, then an operation that takes
// the link from it. The turn must not restart the count. Rank 0 here sends
// no keepalives (an interval of an hour), as a process that stopped would;
// rank 1 waits most of its StallTimeout between operations, then starts one
// that needs rank 0's data. It must fail about StallTimeout after the last
// frame it heard, not StallTimeout after the operation began.
func TestSilenceIsCountedFromTheLastFrameWhoeverReads(t *testing.T) {
	const stall = 2 * time.Second
	for _, cores := range []int{64, 1} {
		lns := make([]*Listener, 2)
		peers := make([]string, 2)
		for i := range lns {
			ln := listen(t)
			lns[i], peers[i] = ln, ln.Addr()
		}
		gangSpec := Gang{Run: "silence", Generation: 1, Peers: peers}
		opts := []Options{
			{Secret: testSecret, Transport: TransportTCP, KeepaliveInterval: time.Hour, hostCores: cores},
			{Secret: testSecret, Transport: TransportTCP, StallTimeout: stall, hostCores: cores},
		}
		groups := make([]*Group, 2)
		errs := each(groups, func(r int, _ *Group) error {
			g, err := Join(context.Background(), lns[r], gangSpec, r, opts[r])
			groups[r] = g
			return err
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// The last frames rank 1 hears from rank 0: a barrier's.
		if err := errors.Join(each(groups, func(r int, g *Group) error { return g.Barrier(context.Background()) })...); err != nil {
			t.Fatal(err)
		}
		lastHeard := time.Now()
		time.Sleep(stall * 95 / 100) // readLeft reads the link meanwhile
		err := groups[1].AllReduce(context.Background(), make([]float32, 8))
		failedAfter := time.Since(lastHeard)
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != 0 || !strings.Contains(pe.Reason, "stalled") {
			t.Fatalf("host cores %d: got %v, want a PeerError naming rank 0 as stalled", cores, err)
		}
		t.Logf("host cores %d: failed %v after the last frame", cores, failedAfter.Round(time.Millisecond))
		// StallTimeout, the grace for an abort from rank 0 (also the right
		// neighbour) and room for a slow machine; restarting the count at the
		// operation would take 4 s.
		if limit := stall + culpritGracePeriod + 800*time.Millisecond; failedAfter > limit {
			t.Errorf("host cores %d: failed %v after the last frame, more than %v", cores, failedAfter, limit)
		}
		for _, g := range groups {
			g.Close()
		}
	}
}

// A rank kept off its cores past its read deadline (a host starved of CPU,
// a paused VM) while its left neighbour's keepalives arrived has heard from
// the neighbour, though it has not read it yet: the runtime's poller fails
// a read whose deadline has passed before it looks at the socket. The group
// must look, read them, and go on, not blame the neighbour. Rank 1's reader
// is held here for 1.5 StallTimeouts, once, with its deadline set; rank 0
// keeps sending keepalives, as does rank 1's own sender.
func TestARankOffItsCoresPastItsDeadlineDoesNotBlameItsNeighbour(t *testing.T) {
	const stall = 400 * time.Millisecond
	var hold atomic.Bool
	held := make(chan struct{}, 1)
	testHookBeforeLeftRead = func(g *Group) {
		if g.rank == 1 && hold.CompareAndSwap(true, false) {
			time.Sleep(stall * 3 / 2)
			held <- struct{}{}
		}
	}
	t.Cleanup(func() { testHookBeforeLeftRead = nil })
	for _, cores := range []int{64, 1} {
		ctx, groups := idlePair(t, stall, cores)
		hold.Store(true)
		select {
		case <-held:
		case <-time.After(10 * stall):
			t.Fatalf("host cores %d: rank 1's reader never read between operations", cores)
		}
		time.Sleep(stall / 4)
		stillSums(t, ctx, groups, fmt.Sprintf("host cores %d, after the hold", cores))
		looked := groups[1].leftLookedAgain.Load()
		t.Logf("host cores %d: rank 1 looked again %d times", cores, looked)
		// The poller's read fails at a passed deadline; fdConn (ranks
		// outnumbering cores) reads the socket before it looks at the time.
		if cores == 64 && looked == 0 {
			t.Errorf("host cores %d: the test did not hold rank 1 past its deadline", cores)
		}
		for _, g := range groups {
			g.Close()
		}
	}
}

// A host starved of CPU, or a paused VM, keeps every rank on it off its
// cores at once: none sends keepalives, and none reads. When they run
// again, every rank's read deadline has passed with nothing waiting, yet no
// neighbour stalled: each rank was itself off schedule, and must not blame
// its neighbour for a silence that was its own. This test stops its own
// process (every rank of the gang) with SIGSTOP for 1.5 StallTimeouts.
func TestAProcessStoppedWholeDoesNotBreakItsGang(t *testing.T) {
	const stall = 400 * time.Millisecond
	for _, cores := range []int{64, 1} {
		ctx, groups := idlePair(t, stall, cores)
		pause := fmt.Sprintf("kill -STOP %d; sleep %.3f; kill -CONT %d", os.Getpid(), (stall * 3 / 2).Seconds(), os.Getpid())
		if out, err := exec.Command("sh", "-c", pause).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", pause, err, out)
		}
		time.Sleep(stall / 2)
		stillSums(t, ctx, groups, fmt.Sprintf("host cores %d, after the pause", cores))
		t.Logf("host cores %d: looked again %d and %d times", cores, groups[0].leftLookedAgain.Load(), groups[1].leftLookedAgain.Load())
		for _, g := range groups {
			g.Close()
		}
	}
}

// Time off its cores excuses a rank's silence once, not for ever: a left
// neighbour that stays silent is declared stalled a StallTimeout after the
// rank last ran late, though nothing was heard since before then. Rank 0
// sends no keepalives here (an interval of an hour), as a stopped process
// would; rank 1 is told it ran late half a StallTimeout after the last
// frame.
func TestTimeOffItsCoresExcusesSilenceOnce(t *testing.T) {
	const stall = 400 * time.Millisecond
	for _, cores := range []int{64, 1} {
		groups, _ := silentPair(t, "excused", time.Hour, Options{Transport: TransportTCP, StallTimeout: stall, hostCores: cores})
		time.Sleep(stall / 2)
		late := time.Now()
		groups[1].offCoresAt.Store(late.UnixNano())
		for groups[1].Err() == nil && time.Since(late) < 10*stall {
			time.Sleep(stall / 20)
		}
		var pe *PeerError
		if err := groups[1].Err(); !errors.As(err, &pe) || pe.Rank != 0 || !strings.Contains(pe.Reason, "stalled") {
			t.Fatalf("host cores %d: %v after the late run, got %v, want a PeerError naming rank 0 as stalled", cores, time.Since(late).Round(time.Millisecond), err)
		}
		looked := groups[1].leftLookedAgain.Load()
		t.Logf("host cores %d: stalled %v after the late run, looked again %d times", cores, time.Since(late).Round(time.Millisecond), looked)
		if looked == 0 {
			t.Errorf("host cores %d: the late run excused nothing: the stall came at the first deadline", cores)
		}
		for _, g := range groups {
			g.Close()
		}
	}
}

// idlePair joins a 2-rank gang over TCP with the stall timeout given, runs
// a barrier, and leaves both ranks' readLeft reading between operations.
// The context ends with the test.
func idlePair(t *testing.T, stall time.Duration, cores int) (context.Context, []*Group) {
	t.Helper()
	groups := gang(t, 2, Options{Transport: TransportTCP, StallTimeout: stall, hostCores: cores})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := errors.Join(each(groups, func(r int, g *Group) error { return g.Barrier(ctx) })...); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * leftIdleGap)
	return ctx, groups
}

// silentPair joins a gang of two ranks with opts, whose rank 0 sends no
// keepalive and declares no stall within stay (a process off its cores, or
// stopped), and has them pass a barrier: rank 0's last frames are its
// barrier's, sent after the time returned. The groups close when the test ends.
func silentPair(t *testing.T, run string, stay time.Duration, opts Options) ([]*Group, time.Time) {
	t.Helper()
	lns := []*Listener{listen(t), listen(t)}
	gangSpec := Gang{Run: run, Generation: 1, Peers: []string{lns[0].Addr(), lns[1].Addr()}}
	opts.Secret = testSecret
	silent := opts
	silent.KeepaliveInterval, silent.StallTimeout = stay, stay
	rankOpts := []Options{silent, opts}
	groups := make([]*Group, 2)
	if err := errors.Join(each(groups, func(r int, _ *Group) error {
		g, err := Join(context.Background(), lns[r], gangSpec, r, rankOpts[r])
		groups[r] = g
		return err
	})...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, g := range groups {
			g.Close()
		}
	})
	before := time.Now()
	if err := errors.Join(each(groups, func(r int, g *Group) error { return g.Barrier(context.Background()) })...); err != nil {
		t.Fatal(err)
	}
	return groups, before
}

// stillSums fails the test unless every group of a 2-rank gang is still up
// and sums.
func stillSums(t *testing.T, ctx context.Context, groups []*Group, when string) {
	t.Helper()
	for r, g := range groups {
		if err := g.Err(); err != nil {
			t.Fatalf("%s: rank %d failed: %v", when, r, err)
		}
	}
	bufs := [][]float32{{1, 2}, {3, 4}}
	if err := errors.Join(each(groups, func(r int, g *Group) error { return g.AllReduce(ctx, bufs[r]) })...); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if bufs[0][0] != 4 || bufs[1][1] != 6 {
		t.Fatalf("%s: sums %v, want [4 6] on each rank", when, bufs)
	}
}

// A rank declared stalled that is alive hears its verdict, and learns from
// it how long it had been silent (PeerError.Silence): its run tells a
// starved or paused rank from a hung one by it. It hears it between
// operations too (Options.OnFailure). Rank 0 sends no keepalives
// (an interval of an hour), as a process off its cores would not; it
// still reads, so the abort of rank 1 (its right neighbour) reaches it.
// Rank 1's own error names rank 0 with no Silence: it is the accuser.
func TestAStalledRankThatHearsItsVerdictKnowsHowLongItWasSilent(t *testing.T) {
	const stall = 400 * time.Millisecond
	told := make(chan error, 2)
	groups, beforeLastSent := silentPair(t, "heard", time.Hour, Options{Transport: TransportTCP, StallTimeout: stall,
		OnFailure: func(err error) { told <- err }})
	for _, g := range groups {
		select {
		case <-g.done:
		case <-time.After(20 * stall):
			t.Fatalf("rank %d: no failure %v after the barrier", g.rank, time.Since(beforeLastSent))
		}
	}
	heardAfter := time.Since(beforeLastSent)
	var accused, accuser *PeerError
	if !errors.As(groups[0].Err(), &accused) || !errors.As(groups[1].Err(), &accuser) {
		t.Fatalf("got %v and %v, want PeerErrors", groups[0].Err(), groups[1].Err())
	}
	for r, pe := range []*PeerError{accused, accuser} {
		if pe.Rank != 0 || pe.Reporter != 1 || !pe.Stalled() {
			t.Fatalf("rank %d: got %+v, want rank 0 declared stalled by rank 1", r, pe)
		}
	}
	t.Logf("rank 0 heard its verdict: %v; silence %v, at most %v", accused, accused.Silence.Round(time.Millisecond), heardAfter.Round(time.Millisecond))
	if accused.Silence < stall || accused.Silence > heardAfter {
		t.Errorf("rank 0's silence %v; want from the StallTimeout %v to the %v since before its last frame", accused.Silence, stall, heardAfter)
	}
	if accuser.Silence != 0 {
		t.Errorf("the accuser's error has a silence %v; want none", accuser.Silence)
	}
	// Each rank's OnFailure was told its group's error, though no operation ran.
	for range 2 {
		select {
		case err := <-told:
			if err != groups[0].Err() && err != groups[1].Err() {
				t.Errorf("OnFailure told %v; want one of the groups' errors", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("OnFailure was not called on both ranks")
		}
	}
	groups[0].Close()
	select {
	case err := <-told:
		t.Errorf("OnFailure told %v again", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// A rank that ran again after a long silence may write (a keepalive due,
// an operation's frames) before it reads the verdict its silence earned:
// the silence it reports is the long one its writes ended, not the moment
// since its last write. One older than a StallTimeout is not.
func TestTheSilenceReportedIsTheOneTheWritesEnded(t *testing.T) {
	g := &Group{opts: Options{StallTimeout: 2 * time.Second}}
	g.lastWrite.Store(time.Now().Add(-3 * time.Second).UnixNano()) // then off its cores for 3 s
	g.wroteRight()                                                 // a keepalive, once it ran again
	g.wroteRight()                                                 // an operation's frame
	if s := g.silence(); s < 3*time.Second || s > 4*time.Second {
		t.Fatalf("silence %v after writing past a 3 s silence; want about 3 s", s)
	}
	g.longGapEnd.Store(time.Now().Add(-3 * time.Second).UnixNano()) // that silence ended 3 s ago
	if s := g.silence(); s > time.Second {
		t.Fatalf("silence %v; want the silence since the last write: one ended more than a StallTimeout ago is not this verdict's", s)
	}
}
