//go:build !linux

package collective

import (
	"errors"
	"net"
	"time"
)

// nbLinkOf is nil where there are no non-blocking links: operations hand
// their receiving half to readLeft instead of running a progress loop.
func nbLinkOf(net.Conn) nbLink { return nil }

type progressWaker struct{}

func newProgressWaker() (*progressWaker, error) {
	return nil, errors.New("no progress loop on this platform")
}

func (*progressWaker) wake()                                                 {}
func (*progressWaker) close()                                                {}
func (*progressWaker) await(_, _ nbLink, _, _, _ bool, _ time.Duration) bool { return false }

func readable(nbLink) bool { return false }
