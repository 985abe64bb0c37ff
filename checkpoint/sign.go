package checkpoint

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// Sign makes the store sign every manifest it commits with key (HMAC-SHA256
// over the manifest's checksum, which covers every object's hash) and treat
// every manifest not signed with that key as corrupt: whoever can write the
// bucket but lacks the key cannot make a checkpoint this store will load.
// Checkpoints written before the store signed are refused too. In format 3
// every block is also tagged with GMAC under the key (hashlist.go), which
// Go refuses to run under GODEBUG=fips140=only: there, saves and loads on
// a store with a key fail, saying so.
func (s *Store) Sign(key []byte) { s.key = key }

// KeyID names a signing key in manifests without revealing it.
func KeyID(key []byte) string {
	sum := sha256.Sum256(append([]byte("durabletrain checkpoint key id\x00"), key...))
	return hex.EncodeToString(sum[:8])
}

func signature(key []byte, checksum string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("durabletrain manifest v1\x00"))
	m.Write([]byte(checksum))
	return hex.EncodeToString(m.Sum(nil))
}

// checkSignature verifies a manifest against the store's key, if it has one.
func (s *Store) checkSignature(m Manifest) error {
	switch {
	case s.key == nil:
		return nil
	case m.Signature == "":
		return errors.New("manifest is not signed, and this worker loads only checkpoints signed with its pool key")
	case m.KeyID != KeyID(s.key):
		return fmt.Errorf("manifest is signed with another key (id %s; this worker's pool key is %s)", m.KeyID, KeyID(s.key))
	case !hmac.Equal([]byte(m.Signature), []byte(signature(s.key, m.Checksum))):
		return errors.New("manifest signature mismatch: forged, or altered after it was signed")
	}
	return nil
}
