package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Simulated hosts of one or two ranks (127.0.0.x, shared memory within a
// host, TCP between hosts) gather over skip links, their first step
// partly over shared memory, and sum as the ring does, bit for bit; so do
// gangs over TCP of every size up to 9, each skip link's last step
// sending fewer blocks than it holds where the world is no power of two.
func TestSkipLinksGatherWhatTheRingSums(t *testing.T) {
	type layout struct {
		name string
		ips  []string
		tcp  bool
	}
	layouts := []layout{{"hosts of 2, 2, 1", []string{"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"}, false}}
	for n := 3; n <= 9; n++ {
		ips := make([]string, n)
		for i := range ips {
			ips[i] = "127.0.0.1"
		}
		layouts = append(layouts, layout{fmt.Sprintf("tcp/ranks=%d", n), ips, true})
	}
	for _, lay := range layouts {
		t.Run(lay.name, func(t *testing.T) {
			n := len(lay.ips)
			opts := Options{GatherBytes: 64 << 10, GatherLinks: true, ChunkBytes: 1024}
			var groups []*Group
			if lay.tcp {
				opts.Transport = TransportTCP
				groups = joinAt(t, lay.ips, opts)
			} else {
				groups = joinOn(t, lay.ips, opts)
			}
			if want := len(skipDistances(n)); len(groups[0].skips) != want || want == 0 {
				t.Fatalf("%d skip links; want %d", len(groups[0].skips), want)
			}
			for _, length := range []int{0, 1, 7, 1003} {
				allReduceInRingOrder(t, groups, length, uint64(length))
			}
		})
	}
}

// A rank that comes to an operation late, for longer than StallTimeout, is
// asked whether it lives (a ping over the skip link the others wait on)
// and answers: nobody is blamed, and every operation completes.
func TestALateRankIsAskedOverSkipLinksNotBlamed(t *testing.T) {
	const stall = 300 * time.Millisecond
	groups := gang(t, 4, Options{Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: true, StallTimeout: stall})
	for op := range 3 {
		late := op + 1
		errs := each(groups, func(r int, g *Group) error {
			if r == late {
				time.Sleep(3 * stall)
			}
			buf := []float32{float32(r), 1}
			if err := g.AllReduce(context.Background(), buf); err != nil {
				return err
			}
			if buf[0] != 6 || buf[1] != 4 {
				return fmt.Errorf("sums %v; want [6 4]", buf)
			}
			return nil
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("operation %d, rank %d late: rank %d: %v", op, late, r, err)
			}
		}
	}
	pings := int64(0)
	for _, g := range groups {
		pings += g.skipPings.Load()
	}
	if pings == 0 {
		t.Fatal("no rank pinged over a skip link: the test waited on nothing")
	}
	t.Logf("%d pings", pings)
}

// A rank whose options disagree on gathering over skip links (GatherLinks
// off where the others have it on) makes every rank's Join fail at once,
// its neighbours naming the difference, the others their neighbours that
// left: none waits for its context to end.
func TestRanksThatDisagreeOnSkipLinksFailToJoin(t *testing.T) {
	const n, odd = 5, 1
	lns := make([]*Listener, n)
	peers := make([]string, n)
	for i := range n {
		lns[i] = listen(t)
		peers[i] = lns[i].Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			opts := Options{Secret: testSecret, Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: true}
			if r == odd {
				opts.GatherLinks = false
			}
			start := time.Now()
			g, err := Join(ctx, lns[r], Gang{Run: "disagree", Generation: 1, Peers: peers}, r, opts)
			took[r], errs[r] = time.Since(start), err
			if g != nil {
				g.Close()
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		switch {
		case err == nil:
			t.Errorf("rank %d joined", r)
		case (r == odd-1 || r == odd || r == odd+1) && !strings.Contains(err.Error(), "options.GatherLinks"):
			t.Errorf("rank %d, beside the odd one: %v; want the difference named", r, err)
		case took[r] > 5*time.Second:
			t.Errorf("rank %d took %v to fail: %v", r, took[r], err)
		default:
			t.Logf("rank %d, after %v: %v", r, took[r].Round(time.Millisecond), err)
		}
	}
}

// A rank whose context ends while it waits on a skip link for a rank that
// never comes returns at once, and the others hear of it.
func TestCancellingWhileWaitingOnASkipLink(t *testing.T) {
	groups := gang(t, 4, Options{Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: true, StallTimeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r, g := range groups {
		if r == 2 { // never calls
			continue
		}
		wg.Go(func() {
			c := context.Background()
			if r == 0 {
				c = ctx
			}
			errs[r] = g.AllReduce(c, make([]float32, 16))
		})
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel()
	wg.Wait()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the ranks took %v to return after rank 0's context ended", took)
	}
	for r, err := range errs {
		var pe *PeerError
		if r != 2 && (!errors.As(err, &pe) || !strings.Contains(err.Error(), "cancelled")) {
			t.Errorf("rank %d: %v; want the cancellation", r, err)
		}
	}
}

// A hello without flags is the earlier releases' version 1, byte for byte
// (they still join gangs that do not gather over links); one with flags is
// version 2 and reads back whole; version 2 without flags is refused.
func TestHellosWithoutFlagsAreVersionOne(t *testing.T) {
	h := hello{Run: "run", Generation: 3, From: 1, To: 2, World: 4}
	h.Nonce[0] = 9
	v1 := h.encode()
	if v1[7] != 1 || len(v1) != 8+2+len(h.Run)+8+12+nonceLen {
		t.Fatalf("a hello without flags: version %d, %d bytes; want version 1 and no flags byte", v1[7], len(v1))
	}
	h.Flags = flagGatherLinks
	v2 := h.encode()
	if v2[7] != handshakeMagicFlags[7] || len(v2) != len(v1)+1 {
		t.Fatalf("a hello with flags: version %d, %d bytes", v2[7], len(v2))
	}
	for _, b := range [][]byte{v1, v2} {
		got, err := readHello(bytes.NewReader(b))
		if err != nil || !bytes.Equal(got.encode(), b) {
			t.Fatalf("read back %+v, %v", got, err)
		}
	}
	bad := slices.Clone(v1)
	bad[7] = handshakeMagicFlags[7]
	bad = slices.Insert(bad, len(bad)-nonceLen, 0)
	if _, err := readHello(bytes.NewReader(bad)); err == nil {
		t.Fatal("a version 2 hello with no flags was read")
	}
}

// A rank that gathers over links needs the addresses of its links' far
// ends as well as its neighbours': Join says which is missing. It needs no
// others: 8 ranks, each knowing only its neighbours and the ranks 2 and 4
// away (as a training run's epoch input gives them), join and sum as the
// ring does.
func TestGatherLinksNeedTheirEndsAddressesOnly(t *testing.T) {
	ln := listen(t)
	peers := []string{ln.Addr(), "127.0.0.1:1", "", "127.0.0.1:3"}
	_, err := Join(context.Background(), ln, Gang{Run: "partial", Generation: 1, Peers: peers}, 0,
		Options{Secret: testSecret, Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: true})
	if err == nil || !strings.Contains(err.Error(), "gang.Peers[2] is empty") {
		t.Fatalf("got %v; want gang.Peers[2] named", err)
	}

	const n = 8
	lns := make([]*Listener, n)
	all := make([]string, n)
	for i := range n {
		lns[i] = listen(t)
		all[i] = lns[i].Addr()
	}
	opts := Options{Secret: testSecret, Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: true}
	groups := make([]*Group, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r, err := range each(groups, func(r int, _ *Group) error {
		known := make([]string, n)
		for _, d := range append([]int{0, 1}, skipDistances(n)...) {
			known[(r+d)%n], known[(r-d+n)%n] = all[(r+d)%n], all[(r-d+n)%n]
		}
		if known[(r+3)%n] != "" {
			return fmt.Errorf("rank %d knows rank %d: the test shows nothing", r, (r+3)%n)
		}
		var err error
		groups[r], err = Join(ctx, lns[r], Gang{Run: "ends-only", Generation: 1, Peers: known}, r, opts)
		return err
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, g := range groups {
			g.Close()
		}
	})
	inputs, want := ringOrderSums(n, 257, 3)
	for r, err := range each(groups, func(r int, g *Group) error {
		if len(g.skips) != 2 {
			return fmt.Errorf("%d skip links; want 2", len(g.skips))
		}
		return g.AllReduce(ctx, inputs[r])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range n {
		for i := range want {
			if math.Float32bits(inputs[r][i]) != math.Float32bits(want[i]) {
				t.Fatalf("rank %d, element %d: %v; the ring's order gives %v", r, i, inputs[r][i], want[i])
			}
		}
	}
}
