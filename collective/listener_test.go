package collective

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// strangerDial connects from another loopback address, as a different host would.
func strangerDial(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from %s (no 127/8 loopback here?): %v", from, err)
	}
	return c
}

// TestStrangersCannotDelayAJoin: before and while two ranks join, strangers
// on other hosts flood both listeners with hellos for unknown runs, open
// connections that never speak, and impostors send hellos for the very
// connections the ranks wait for and then stall the handshake. The join must
// not wait for any of them, and the refusals must not flood the log.
func TestStrangersCannotDelayAJoin(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	var lns [2]*Listener
	peers := make([]string, 2)
	for r := range lns {
		ln, err := Listen("127.0.0.1:0", zap.New(core))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		lns[r], peers[r] = ln, ln.Addr()
	}
	gang := Gang{Run: "victim", Generation: 3, Peers: peers}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	attack := func() {
		for i := range 4 { // four stranger hosts
			from := fmt.Sprintf("127.0.0.%d", 10+i)
			for r, addr := range peers {
				for range maxConnsPerHost + 16 { // hellos for runs nobody joins
					c := strangerDial(t, from, addr)
					var h hello
					h.Run = rand.Text()
					h.Generation, h.From, h.To, h.World = 1, 1, 0, 2
					c.Write(h.encode())
					conns = append(conns, c)
				}
				for range 8 { // silent connections
					conns = append(conns, strangerDial(t, from, addr))
				}
				// Impostors for the connection rank r waits for: hello, then nothing.
				c := strangerDial(t, from, addr)
				left := (r + 1) % 2
				c.Write(hello{Run: gang.Run, Generation: gang.Generation, From: uint32(left), To: uint32(r), World: 2}.encode())
				conns = append(conns, c)
			}
		}
	}
	attack()
	time.Sleep(200 * time.Millisecond) // the hellos are parked
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	var groups [2]*Group
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { groups[r], errs[r] = Join(ctx, lns[r], gang, r, Options{Secret: testSecret}) })
	}
	attack() // and again while they join
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatalf("join under attack: %v (impostors and strangers delayed it past the handshake timeout)", err)
	}
	t.Logf("joined in %v with %d stranger connections open", time.Since(start).Round(time.Millisecond), len(conns))
	defer groups[0].Close()
	defer groups[1].Close()
	bufs := [][]float32{{1, 2}, {10, 20}}
	if err := errors.Join(each(groups[:], func(r int, g *Group) error { return g.AllReduce(ctx, bufs[r]) })...); err != nil || bufs[0][1] != 22 {
		t.Fatalf("all-reduce after the attack: %v %v", err, bufs[0])
	}
	if n := logs.FilterMessage("collective connection refused").Len(); n == 0 || n > 20 {
		t.Errorf("%d log lines for the refused connections; want some, at most a line a second", n)
	}
}

// TestOneHostIsLimited: a host over its limit of unauthenticated connections
// is refused at once, and other hosts are still served.
func TestOneHostIsLimited(t *testing.T) {
	ln, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range maxConnsPerHost + 1 {
		conns = append(conns, strangerDial(t, "127.0.0.20", ln.Addr()))
	}
	// The listener admits them in whatever order its accept loop runs:
	// exactly one of them, whichever came last, is closed at once; the
	// others wait (silent, within the hello timeout).
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			var ne net.Error
			if _, err := c.Read(make([]byte, 1)); err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := closed.Load(); n != 1 {
		t.Fatalf("%d of %d connections from one host were closed at once; want 1 (the limit is %d)", n, len(conns), maxConnsPerHost)
	}
	// Another host is still served.
	other := strangerDial(t, "127.0.0.21", ln.Addr())
	defer other.Close()
	other.Write(hello{Run: "r", Generation: 1, From: 1, To: 0, World: 2}.encode())
	time.Sleep(50 * time.Millisecond)
	ln.mu.Lock()
	parked := len(ln.parked)
	ln.mu.Unlock()
	if parked != 1 {
		t.Fatalf("%d parked hellos; want the other host's one", parked)
	}
}

// TestRanksAuthenticateWithTheirOwnKeys: with an X25519 identity per rank and
// only public keys shared, a gang forms and reduces; a rank whose private key
// is not the one its neighbours were told of is refused.
func TestRanksAuthenticateWithTheirOwnKeys(t *testing.T) {
	const world = 3
	keys := make([]*ecdh.PrivateKey, world)
	gang := Gang{Run: "keys", Generation: 1, Peers: make([]string, world), PublicKeys: make([][]byte, world)}
	lns := make([]*Listener, world)
	for r := range world {
		var err error
		if keys[r], err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			t.Fatal(err)
		}
		gang.PublicKeys[r] = keys[r].PublicKey().Bytes()
		if lns[r], err = Listen("127.0.0.1:0", nil); err != nil {
			t.Fatal(err)
		}
		defer lns[r].Close()
		gang.Peers[r] = lns[r].Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	groups := make([]*Group, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() { groups[r], errs[r] = Join(ctx, lns[r], gang, r, Options{Identity: keys[r]}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	bufs := [][]float32{{1}, {2}, {4}}
	if err := errors.Join(each(groups, func(r int, g *Group) error { return g.AllReduce(ctx, bufs[r]) })...); err != nil || bufs[2][0] != 7 {
		t.Fatalf("all-reduce with per-rank keys: %v %v", err, bufs)
	}
	for _, g := range groups {
		g.Close()
	}

	// An impostor for rank 1 of the next generation, with a key of its own
	// that it claims as rank 1's: ranks 0 and 2 know the real one.
	imp, _ := ecdh.X25519().GenerateKey(rand.Reader)
	next := gang
	next.Generation = 2
	forged := next
	forged.PublicKeys = append([][]byte(nil), next.PublicKeys...)
	forged.PublicKeys[1] = imp.PublicKey().Bytes()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	var impErr error
	for r := range world {
		wg.Go(func() {
			var g *Group
			var err error
			if r == 1 {
				g, impErr = Join(ctx2, lns[1], forged, 1, Options{Identity: imp})
			} else {
				g, err = Join(ctx2, lns[r], next, r, Options{Identity: keys[r]})
			}
			if g != nil {
				t.Errorf("rank %d joined a gang with an impostor", r)
				g.Close()
			}
			_ = err
		})
	}
	wg.Wait()
	if !errors.Is(impErr, errAuth) {
		t.Errorf("the impostor's join: %v; want an authentication error", impErr)
	}

	if _, err := Join(ctx, lns[0], gang, 0, Options{Identity: imp}); err == nil {
		t.Error("a rank whose key is not gang.PublicKeys[rank] joined")
	}
}
