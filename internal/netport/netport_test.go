package netport

import (
	"net"
	"strconv"
	"testing"
)

// A port is drawn below the ephemeral range, where no outgoing
// connection takes it before the program binds it, and is free when drawn.
func TestFreeIsOutsideTheEphemeralRange(t *testing.T) {
	lo, ok := ephemeralLow()
	if !ok {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range here")
	}
	seen := map[int]bool{}
	for range 20 {
		port := Free("127.0.0.1")
		if lo > band+1024 && (port >= lo || port < lo-band) {
			t.Fatalf("port %d is not in [%d, %d)", port, lo-band, lo)
		}
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d was handed out but cannot be bound: %v", port, err)
		}
		ln.Close()
		seen[port] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 draws gave only %d distinct ports; concurrent runs would collide", len(seen))
	}
}
