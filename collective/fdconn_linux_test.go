package collective

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fdPair is an fdConn and the plain TCP connection at its other end.
func fdPair(t *testing.T, poll pollPolicy) (*fdConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	t.Cleanup(func() { peer.Close() })
	c, err := newFDConn(dialed, poll)
	if err != nil {
		t.Fatal(err)
	}
	fc, ok := c.(*fdConn)
	if !ok {
		t.Fatalf("newFDConn returned %T, want *fdConn", c)
	}
	t.Cleanup(func() { fc.Close() })
	if _, err := dialed.Write([]byte("x")); err == nil {
		t.Fatal("the original connection still writes: newFDConn must close it")
	}
	return fc, peer
}

func TestFDConnCarriesBytesBothWays(t *testing.T) {
	var active atomic.Bool
	for _, poll := range []pollPolicy{{}, {active: &active, window: time.Millisecond}, {active: &active, window: time.Millisecond, yield: new(coreYielder)}} {
		active.Store(true)
		fc, peer := fdPair(t, poll)
		want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than socket buffers hold
		go func() {
			time.Sleep(5 * time.Millisecond) // the reader waits first, looking, then in poll(2)
			peer.Write(want)
		}()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(fc, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("policy %+v: read %v, equal %v", poll, err, bytes.Equal(got, want))
		}
		echoed := make(chan []byte, 1)
		go func() {
			b := make([]byte, len(want))
			io.ReadFull(peer, b)
			echoed <- b
		}()
		if n, err := fc.Write(want); n != len(want) || err != nil {
			t.Fatalf("wrote %d of %d: %v", n, len(want), err)
		}
		if !bytes.Equal(<-echoed, want) {
			t.Fatal("the peer read other bytes than were written")
		}
		peer.Close()
		if n, err := fc.Read(got); n != 0 || err != io.EOF {
			t.Fatalf("after the peer closed: %d, %v; want 0, io.EOF", n, err)
		}
	}
}

func TestFDConnReadDeadline(t *testing.T) {
	fc, _ := fdPair(t, pollPolicy{})
	fc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err := fc.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want os.ErrDeadlineExceeded", err)
	}
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("returned after %v, before the deadline", waited)
	}
	// A deadline moved into the past by another goroutine wakes a waiting read.
	fc.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := fc.Read(make([]byte, 1))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	fc.SetReadDeadline(time.Now())
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("got %v, want os.ErrDeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read waiting in poll(2) did not see its deadline move")
	}
}

// TestFDConnCloseWakesBlockedCalls: Close from another goroutine ends a read
// waiting for data and a write waiting for a peer that does not read, and
// the descriptor is closed once both have returned, not before.
func TestFDConnCloseWakesBlockedCalls(t *testing.T) {
	fc, _ := fdPair(t, pollPolicy{})
	fd := fc.fd
	readDone, writeDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := fc.Read(make([]byte, 1))
		readDone <- err
	}()
	go func() {
		_, err := fc.Write(make([]byte, 64<<20)) // the peer never reads: this blocks
		writeDone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := fc.Close(); err != nil {
		t.Fatal(err)
	}
	for what, ch := range map[string]chan error{"read": readDone, "write": writeDone} {
		select {
		case err := <-ch:
			if err == nil {
				t.Errorf("%s returned no error after Close", what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Close did not wake the blocked %s", what)
		}
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("descriptor %d still open after Close and its last call (fcntl: %v)", fd, err)
	}
	if _, err := fc.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read after Close: %v, want net.ErrClosed", err)
	}
	if err := fc.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v, want net.ErrClosed", err)
	}
}

// TestFDConnLooksOnlyDuringAnOperation: a reader looking for data finds
// data that comes, and gives up (to sleep in poll(2)) as soon as the
// operation ends, however long its window.
func TestFDConnLooksOnlyDuringAnOperation(t *testing.T) {
	for _, yield := range []*coreYielder{nil, new(coreYielder)} {
		var active atomic.Bool
		active.Store(true)
		fc, peer := fdPair(t, pollPolicy{active: &active, window: time.Hour, yield: yield})
		found := make(chan bool, 1)
		go func() { found <- fc.lookFor() }()
		time.Sleep(10 * time.Millisecond)
		peer.Write([]byte("a"))
		select {
		case ok := <-found:
			if !ok && (yield == nil || yield.ready()) { // not a yield that took too long (a loaded machine)
				t.Fatalf("yield %v: lookFor gave up with data waiting", yield)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("yield %v: lookFor did not see the data", yield)
		}
		fc.Read(make([]byte, 1))
		go func() { found <- fc.lookFor() }()
		time.Sleep(10 * time.Millisecond)
		active.Store(false)
		select {
		case ok := <-found:
			if ok {
				t.Fatalf("yield %v: lookFor found data that was never sent", yield)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("yield %v: lookFor kept looking after the operation ended", yield)
		}
	}
}

// TestLookingStopsWhileYieldsAreHeldOff: once a yield has lost the core to a
// process not of ours (coreYielder held off), a rank sleeps at once instead
// of looking, over TCP and over shared memory alike.
func TestLookingStopsWhileYieldsAreHeldOff(t *testing.T) {
	y := new(coreYielder)
	y.heldOffUntil.Store(time.Now().Add(time.Hour).UnixNano())
	var active atomic.Bool
	active.Store(true)
	fc, _ := fdPair(t, pollPolicy{active: &active, window: time.Hour, yield: y})
	found := make(chan bool, 1)
	go func() { found <- fc.lookFor() }()
	select {
	case ok := <-found:
		if ok {
			t.Fatal("lookFor found data that was never sent")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lookFor looked on while yields were held off")
	}
	g := &Group{yield: y}
	if g.pause() {
		t.Fatal("a shared-memory link's pause went on yielding while yields were held off")
	}
	y.heldOffUntil.Store(0)
	if !y.ready() {
		t.Fatal("yields still held off after the hold ended")
	}
}

// TestTCPOutsideThePollerSumsAsThroughIt: ranks that read their left link
// outside the runtime's poller (as on a host with more ranks than cores)
// sum bit for bit as ranks reading through it, on every path an operation
// can take over TCP: the small all-reduce, operations forwarded by the
// reader, the ring, a broadcast and a barrier.
func TestTCPOutsideThePollerSumsAsThroughIt(t *testing.T) {
	const world = 4
	results := map[bool][][]float32{}
	for _, outside := range []bool{false, true} {
		cores := 1 // fewer than the ranks: the left link is read outside the poller
		if !outside {
			cores = world
		}
		groups := gang(t, world, Options{Transport: TransportTCP, GatherBytes: 16 << 10, ChunkBytes: 64 << 10, hostCores: cores})
		if _, isFD := groups[1].leftConn.(*fdConn); isFD != outside {
			t.Fatalf("oversubscribed %v: left link is %T", outside, groups[1].leftConn)
		}
		var sums [][]float32
		var mu sync.Mutex
		errs := each(groups, func(r int, g *Group) error {
			var mine [][]float32
			for step, n := range []int{1 << 10, 1 << 14, 300_001, 0, 7, 1 << 10} {
				buf := make([]float32, n)
				rng := rand.New(rand.NewPCG(uint64(r), uint64(step)))
				for i := range buf {
					buf[i] = float32(rng.NormFloat64())
				}
				if err := g.AllReduce(context.Background(), buf); err != nil {
					return err
				}
				if err := g.Broadcast(context.Background(), buf, step%world); err != nil {
					return err
				}
				mine = append(mine, buf)
			}
			if r == 2 {
				mu.Lock()
				sums = mine
				mu.Unlock()
			}
			return g.Barrier(context.Background())
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("oversubscribed %v: %v", outside, err)
		}
		results[outside] = sums
	}
	for step := range results[false] {
		a, b := results[false][step], results[true][step]
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("operation %d, element %d: %v through the poller, %v outside it", step, i, a[i], b[i])
			}
		}
	}
}

// TestALargeOperationLooksUntilTheCoreIsTaken: where every rank has a core,
// a large operation over TCP looks for its frames (largeSpin) between
// Gosched calls; three looks in a row that kept it off its core longer than
// yieldTooLong (a loaded host) stop the looking and hold it off, so the
// next wait sleeps at once. Where ranks outnumber cores it never looks.
func TestALargeOperationLooksUntilTheCoreIsTaken(t *testing.T) {
	for _, c := range []struct {
		cores int
		looks bool
	}{{64, true}, {1, false}} {
		groups := gang(t, 2, Options{Transport: TransportTCP, hostCores: c.cores})
		if got := groups[0].largeSpin != nil; got != c.looks {
			t.Fatalf("host cores %d: large operations look: %v, want %v", c.cores, got, c.looks)
		}
	}
	y := new(coreYielder)
	offCore := func() { time.Sleep(2 * yieldTooLong) }
	for i := 1; i < longYields; i++ {
		if !y.pass(offCore) {
			t.Fatalf("look %d off the core stopped the looking; it takes %d in a row", i, longYields)
		}
	}
	if y.pass(offCore) || y.ready() {
		t.Fatalf("%d looks in a row off the core did not hold looking off", longYields)
	}
	w := spinWait{window: time.Hour, yield: y}
	if w.poll(nil) {
		t.Fatal("a wait looked on while looking was held off")
	}
	y.heldOffUntil.Store(0)
	if w := (spinWait{window: time.Hour, yield: y}); !w.poll(nil) {
		t.Fatal("a wait did not look once the hold ended")
	}
}
