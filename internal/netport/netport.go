// Package netport owns the choice of a TCP port that another process will
// bind later: a rendezvous port for torch.distributed, a port for a child
// server such as MinIO.
package netport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Free is a TCP port free now on every address of this host, or 0. A port
// the kernel hands out for listening on ":0" comes from the ephemeral range, where any outgoing
// connection on the host may take it as its local port before the program
// binds it ("Address already in use"). So the port is drawn at random from
// just below the ephemeral range, which no connection takes unasked, and
// only where the range leaves no room does it fall back to the kernel's pick.
func Free(host string) int {
	if lo, ok := ephemeralLow(); ok && lo > band+1024 {
		for range 64 {
			port := lo - 1 - rand.IntN(band)
			if ln, err := net.Listen("tcp", ":"+strconv.Itoa(port)); err == nil {
				ln.Close()
				return port
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		if ln, err = net.Listen("tcp", ":0"); err != nil {
			return 0
		}
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// band is how many ports below the ephemeral range Free draws from.
const band = 8192

// ephemeralLow is the first port of Linux's ephemeral range, if it can be read.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}
