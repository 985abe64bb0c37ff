package workflows

import "crypto/rand"

// newSecret is the per-gang collective secret; it runs inside a SideEffect.
func newSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}
