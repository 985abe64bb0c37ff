//go:build !linux

package collective

import (
	"errors"
	"sync/atomic"
)

// shmRing exists on Linux only; elsewhere every byte goes over TCP.
type shmRing struct{}

func createShmRing(int, int) (*shmRing, string, []byte, error) {
	return nil, "", nil, errors.New("shared memory transport needs Linux")
}

func openShmRing(string, int, int, []byte) (*shmRing, error) {
	return nil, errors.New("shared memory transport needs Linux")
}

func (r *shmRing) slot(int) []byte          { return nil }
func (r *shmRing) close()                   {}
func (r *shmRing) consumed() *atomic.Uint64 { return nil }
