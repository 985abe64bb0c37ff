package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"time"
	"unsafe"
)

const (
	// shmRingBytes is the default of Options.ShmRingBytes: what a sender can
	// have in flight through shared memory, in slots of ShmChunkBytes (at
	// least 4, at most shmMaxSlots). A rank whose neighbour is off its core
	// (a busy host) goes on sending until the ring is full: with a CPU-bound
	// process per core beside 4 ranks, rings of 4 slots of 128 KiB made 16
	// and 64 MiB all-reduces about twice as slow as rings of 32 (BENCHMARKS.md).
	shmRingBytes = 4 << 20
	// shmSignalled marks an offer of a ring whose sender signals through the
	// ring itself (a counter and a futex, shmlink.go), not over TCP. It is
	// set in the offer's slot count, so that a peer of an earlier release,
	// which signalled every chunk over TCP, sees too many slots and declines:
	// the two then talk over TCP only.
	shmSignalled = 1 << 31
)

// shmSlots is how many slots of slotBytes a ring of ringBytes (0: the
// default) has.
func shmSlots(slotBytes, ringBytes int) int {
	if ringBytes <= 0 {
		ringBytes = shmRingBytes
	}
	return max(4, min(shmMaxSlots, ringBytes/slotBytes))
}

// negotiateShm runs after both handshakes: this rank offers a ring to its left
// neighbour (who sends us data) and answers its right neighbour's offer. Each
// side falls back to TCP on any failure; offers and answers are small enough
// never to block on socket buffers, so all ranks can do this at once.
//
// A neighbour sends its offer only once its own other link is up, which
// waits on its other neighbour, and so on around the ring: a slow rank
// anywhere delays every offer. So the wait is bounded by the join's own
// deadline (ctx), when it has a later one than handshakeTimeout.
func (g *Group) negotiateShm(ctx context.Context) (err error) {
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d
	}
	g.leftConn.SetDeadline(deadline)
	g.rightConn.SetDeadline(deadline)
	defer g.leftConn.SetDeadline(time.Time{})
	defer g.rightConn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { // cancelled: wake the reads below
		g.leftConn.SetDeadline(time.Now())
		g.rightConn.SetDeadline(time.Now())
	})
	defer func() {
		// Runs before the deadlines are cleared. If the cancellation's
		// func has run (or is running), it may yet set a past deadline:
		// the links are not to be trusted, so the join fails.
		if !stop() && err == nil {
			err = fmt.Errorf("negotiating the transport: %w", context.Cause(ctx))
		}
	}()

	slotBytes := g.opts.ShmChunkBytes
	var offered *shmRing
	var path string
	var token []byte
	offer := binary.BigEndian.AppendUint16(nil, 0)
	if g.shmWith(g.left) {
		var err error
		slots := shmSlots(slotBytes, g.opts.ShmRingBytes)
		if offered, path, token, err = createShmRing(slots, slotBytes); err == nil {
			defer os.Remove(path)
			offer = binary.BigEndian.AppendUint16(nil, uint16(len(path)))
			offer = append(offer, path...)
			offer = binary.BigEndian.AppendUint32(offer, uint32(slots)|shmSignalled)
			offer = binary.BigEndian.AppendUint32(offer, uint32(slotBytes))
			offer = append(offer, token...)
		}
	}
	if _, err := g.leftConn.Write(offer); err != nil {
		return fmt.Errorf("offering shared memory to rank %d: %w", g.left, err)
	}

	// Answer the right neighbour's offer.
	var n [2]byte
	if _, err := io.ReadFull(g.rightConn, n[:]); err != nil {
		return fmt.Errorf("reading rank %d's transport offer: %w", g.right, err)
	}
	answer := []byte{0}
	if l := binary.BigEndian.Uint16(n[:]); l > 0 {
		rest := make([]byte, int(l)+8+shmTokenLen)
		if _, err := io.ReadFull(g.rightConn, rest); err != nil {
			return fmt.Errorf("reading rank %d's transport offer: %w", g.right, err)
		}
		peerPath := string(rest[:l])
		slots := binary.BigEndian.Uint32(rest[l:])
		size := int(binary.BigEndian.Uint32(rest[l+4:]))
		signalled, n := slots&shmSignalled != 0, int(slots&^shmSignalled)
		if size == g.opts.ShmChunkBytes && signalled && n > 0 && n <= shmMaxSlots && g.shmWith(g.right) {
			if ring, err := openShmRing(peerPath, n, size, rest[l+8:]); err == nil {
				g.sendRing = ring
				answer[0] = 1
			}
		}
	}
	if _, err := g.rightConn.Write(answer); err != nil {
		return fmt.Errorf("answering rank %d's transport offer: %w", g.right, err)
	}

	// Did the left neighbour take our ring?
	var got [1]byte
	if _, err := io.ReadFull(g.leftConn, got[:]); err != nil {
		return fmt.Errorf("reading rank %d's transport answer: %w", g.left, err)
	}
	if offered != nil {
		if got[0] == 1 {
			g.recvRing = offered
		} else {
			offered.close()
		}
	}
	if g.flags&flagHostWindows != 0 {
		return g.exchangeWindows()
	}
	return nil
}

// Transport choices for Options.Transport.
const (
	TransportAuto = ""    // shared memory with neighbours on the same host, TCP otherwise
	TransportTCP  = "tcp" // every byte over TCP
	// TransportSameIP: shared memory only with neighbours whose listener has
	// this rank's IP address, TCP otherwise: for processes that share a
	// machine but stand for different hosts (simulated hosts on 127.0.0.x).
	TransportSameIP = "same-ip"
)

// shmWith says whether this rank may use shared memory with neighbour peer.
func (g *Group) shmWith(peer int) bool {
	switch g.opts.Transport {
	case TransportTCP:
		return false
	case TransportSameIP:
		mine, _, err1 := net.SplitHostPort(g.gang.Peers[g.rank])
		theirs, _, err2 := net.SplitHostPort(g.gang.Peers[peer])
		return err1 == nil && err2 == nil && mine == theirs
	}
	return true
}

func asFloats(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Transports reports how this rank sends to its right neighbour and receives
// from its left one: "shm" or "tcp" each.
func (g *Group) Transports() (send, receive string) {
	send, receive = "tcp", "tcp"
	if g.sendRing != nil {
		send = "shm"
	}
	if g.recvRing != nil {
		receive = "shm"
	}
	return send, receive
}
