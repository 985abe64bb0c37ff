//go:build !linux

package collective

import (
	"errors"
	"sync/atomic"
	"time"
)

// shmRing exists on Linux only; elsewhere every byte goes over TCP.
type shmRing struct{ slots, slotBytes int }

func createShmRing(int, int) (*shmRing, string, []byte, error) {
	return nil, "", nil, errors.New("shared memory transport needs Linux")
}

func openShmRing(string, int, int, []byte) (*shmRing, error) {
	return nil, errors.New("shared memory transport needs Linux")
}

const (
	shmMaxSlots = 64
	shmTokenLen = 32
)

func (r *shmRing) slot(int) []byte                           { return nil }
func (r *shmRing) close()                                    {}
func (r *shmRing) consumed() *atomic.Uint32                  { return nil }
func (r *shmRing) published() *atomic.Uint32                 { return nil }
func (r *shmRing) recvWaiting() *atomic.Uint32               { return nil }
func (r *shmRing) sendWaiting() *atomic.Uint32               { return nil }
func (r *shmRing) desc(int) (seq, op, length *atomic.Uint32) { return nil, nil, nil }
func futexWait(*atomic.Uint32, uint32, time.Duration)        {}
func futexWake(*atomic.Uint32)                               {}

func osYield()                                 {}
func (r *shmRing) release()                    {}
func (r *shmRing) acquire()                    {}
func (r *shmRing) setClock([]byte) *shmRing    { return r }
func (r *shmRing) word(int) *atomic.Uint32     { return nil }
func (r *shmRing) headerBytes(int, int) []byte { return nil }
