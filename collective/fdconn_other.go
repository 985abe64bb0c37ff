//go:build !linux

package collective

import (
	"net"
	"sync/atomic"
	"time"
)

// pollPolicy: see fdconn_linux.go.
type pollPolicy struct {
	active *atomic.Bool
	window time.Duration
	yield  *coreYielder
}

// newFDConn leaves c in the runtime's poller where there is no fdConn.
func newFDConn(c net.Conn, _ pollPolicy) (net.Conn, error) { return c, nil }
