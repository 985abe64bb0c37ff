package activities

import (
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// MinPoolKeyBytes is the shortest pool key a worker accepts.
const MinPoolKeyBytes = 32

// slotKey is the X25519 identity of one hold of a slot: made when the hold
// begins, forgotten when it ends. Only its public half leaves the worker, in
// the slot's grant.
type slotKey struct {
	workflowID string
	private    *ecdh.PrivateKey
}

func newSlotKey(workflowID string) (*slotKey, error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return &slotKey{workflowID: workflowID, private: k}, nil
}

// grantMAC binds a slot's collective address and public key to the workflow
// holding it, under the pool key.
func grantMAC(poolKey []byte, workflowID, collective string, publicKey []byte) []byte {
	m := hmac.New(sha256.New, poolKey)
	for _, part := range [][]byte{[]byte("durabletrain grant v1"), []byte(workflowID), []byte(collective), publicKey} {
		var n [4]byte
		n[0], n[1], n[2], n[3] = byte(len(part)>>24), byte(len(part)>>16), byte(len(part)>>8), byte(len(part))
		m.Write(n[:])
		m.Write(part)
	}
	return m.Sum(nil)
}

// verifyGrants checks, on a worker with a pool key, that every rank of the
// gang this rank knows of (rank 0's host, its own and its ring neighbours')
// was placed by a worker of the pool: a placement made up in a forged
// signal fails, naming the rank. Each link of the ring is so checked from
// both ends.
func (a *Agent) verifyGrants(workflowID string, in spec.EpochInput) error {
	if len(in.PublicKeys) != len(in.Peers) {
		return fmt.Errorf("epoch input has %d public keys for %d peers", len(in.PublicKeys), len(in.Peers))
	}
	if a.PoolKey == nil {
		return nil
	}
	for rank := range in.Peers {
		if in.Peers[rank] == "" {
			continue // a rank this one never talks to
		}
		var got []byte
		if rank < len(in.Grants) {
			got = in.Grants[rank]
		}
		if !hmac.Equal(got, grantMAC(a.PoolKey, workflowID, in.Peers[rank], in.PublicKeys[rank])) {
			return temporal.NewNonRetryableApplicationError(fmt.Sprintf(
				"rank %d's placement (collective %s) is not signed with this worker pool's key: a slot-granted signal from outside the pool, or a worker with another -pool-key-file; this rank will not join that gang",
				rank, in.Peers[rank]), spec.ErrForgedGrant, nil)
		}
	}
	return nil
}
