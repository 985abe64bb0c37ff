package collective

import (
	"net"
	"testing"
	"time"
)

func dialTCP(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }

// listen is a collective listener on loopback, closed when the test ends.
func listen(t testing.TB) *Listener {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
