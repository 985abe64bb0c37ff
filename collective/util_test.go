package collective

import (
	"net"
	"time"
)

func dialTCP(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }
