package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A right neighbour whose address answers nothing (a host cut off: every
// SYN dropped) fails the join with a PeerError naming it once one attempt
// has gone unanswered for UnreachableTimeout; without it the join waits on
// until its context ends. The silent address is a real listener whose
// accept queue is full, so the kernel drops further SYNs unanswered.
func TestJoinGivesUpOnAnUnansweringNeighbourAfterUnreachableTimeout(t *testing.T) {
	ln := listen(t)
	silent := silentAddress(t)
	peers := []string{ln.Addr(), silent}
	for _, unreachable := range []time.Duration{300 * time.Millisecond, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		_, err := Join(ctx, ln, Gang{Run: "unanswered", Generation: 1, Peers: peers}, 0, Options{Secret: testSecret, UnreachableTimeout: unreachable, RefusedTimeout: 100 * time.Millisecond})
		cancel()
		var pe *PeerError
		switch {
		case unreachable > 0 && (!errors.As(err, &pe) || pe.Rank != 1 || pe.Reporter != 0 || !strings.Contains(pe.Reason, "answered no connection attempt")):
			t.Fatalf("UnreachableTimeout %v: %v; want a PeerError naming rank 1", unreachable, err)
		case unreachable == 0 && (errors.As(err, &pe) || !errors.Is(err, context.DeadlineExceeded)):
			t.Fatalf("no UnreachableTimeout: %v; want the context's deadline", err)
		}
	}
}

// silentAddress is a TCP address that answers no connection attempt: a
// listener with a backlog of 0 whose one queued connection is never
// accepted, so that Linux drops every SYN after it.
func silentAddress(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel answers connections past a full accept queue: no silent address to test with")
	}
	return addr
}
