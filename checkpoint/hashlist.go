package checkpoint

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"runtime"
	"sync"

	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"
)

// BlockSize is the unit an object is hashed in. An object's hash in the
// manifest is a hash list: the hash of the concatenated hashes of its
// blocks. That is as strong a check as one hash over the bytes, but every
// block hashes on its own core, so verification keeps up with the disk.
const BlockSize = 8 << 20

// hashAlgo is the check of a manifest's objects, fixed by its format:
// format 1 hashed with SHA-256; format 2 with BLAKE3; format 3
// (FormatVersion) checksums with XXH3-128 and, on a store with a key,
// authenticates every block with GMAC as well (blockCheck).
//
// Why format 3: a checkpoint's hash was the ceiling of its loads. On a
// 2-core VM whose disk read 5 GB/s, verified reads took 0.60-0.73 CPU
// seconds a GB, half of it BLAKE3, and loaded at 0.38-0.48x dd
// (BENCHMARKS.md, 2026-11-27). A cryptographic hash of every byte buys
// nothing on a store without a key: whoever can alter an object can
// rewrite the manifest's hash too, so what a hash there can catch is
// damage, which a 128-bit checksum catches as well. XXH3-128
// (github.com/zeebo/xxh3, by BLAKE3's library's author, with AVX2 and
// AVX-512 code) ran at 84-87 GB/s on one core there, against BLAKE3's
// 3.1. On a store with a key, a checksum is not enough (XXH3 is not
// collision resistant: whoever can write the bucket could swap a block
// for one with the same checksum), so each block also carries a GMAC tag
// (AES-256-GCM sealing nothing, crypto/cipher: AES-NI and carry-less
// multiplication) under a key of the object's own, derived from the
// pool key: 7.6-7.9 GB/s on one core, 2.5x BLAKE3, and unforgeable
// without the key. Poly1305, the other fast MAC at hand, ran at 3.5.
//
// BLAKE3 (format 2) is github.com/zeebo/blake3; the hash lists of
// lukechampine.com/blake3, used before it, are the same
// (TestBLAKE3HashListsMatchTheEarlierLibrary).
type hashAlgo int

const (
	hashSHA256 hashAlgo = iota
	hashBLAKE3
	hashXXH3
)

// algoOf is the object check of a manifest format (0 for a format it does not know).
func algoOf(format int) (hashAlgo, bool) {
	switch format {
	case 1:
		return hashSHA256, true
	case 2:
		return hashBLAKE3, true
	case 3:
		return hashXXH3, true
	}
	return 0, false
}

func (a hashAlgo) String() string {
	switch a {
	case hashBLAKE3:
		return "BLAKE3"
	case hashXXH3:
		return "XXH3-128"
	}
	return "SHA-256"
}

// blockCheck is what each block of one object is checked with: its
// format's hash or checksum, and in format 3 on a store with a key a GMAC
// tag as well. A block's digest is the hash (32 bytes), or the XXH3-128
// checksum in the first 16 bytes and the tag (zero without one) in the last.
type blockCheck struct {
	algo hashAlgo
	mac  cipher.AEAD // GMAC under the object's key (objectMAC); nil: none
}

func (b blockCheck) sum(i int, data []byte) [32]byte {
	switch b.algo {
	case hashBLAKE3:
		return blake3.Sum256(data)
	case hashXXH3:
		var d [32]byte
		c := xxh3.Hash128(data).Bytes()
		copy(d[:16], c[:])
		if b.mac != nil {
			b.mac.Seal(d[16:16], blockNonce(i), nil, data)
		}
		return d
	}
	return sha256.Sum256(data)
}

// newHead is a running sum for a block taken in pieces (its bytes are not
// all in one place), or nil where the check needs the block whole: GMAC
// takes its input at once.
func (b blockCheck) newHead() hash.Hash {
	switch {
	case b.wholeBlocks():
		return nil
	case b.algo == hashBLAKE3:
		return blake3.New()
	case b.algo == hashXXH3:
		return xxh3.New128()
	}
	return sha256.New()
}

// wholeBlocks says whether a block must be checked whole, in one piece
// (newHead is nil): with a GMAC.
func (b blockCheck) wholeBlocks() bool { return b.mac != nil }

// macInfo names what an object's MAC key is for, in its derivation.
const macInfo = "durabletrain checkpoint object GMAC-AES-256 v1"

// objectMAC is the GMAC of one object: AES-256-GCM under a key derived
// from the pool key by HKDF-SHA256, salted with the object's random nonce
// (Object.MACNonce), so that no two objects share a key and block i's
// nonce (blockNonce) is never used twice under one.
func objectMAC(poolKey []byte, nonceHex string) (cipher.AEAD, error) {
	salt, err := hex.DecodeString(nonceHex)
	if err != nil || len(salt) != macNonceBytes {
		return nil, fmt.Errorf("MAC nonce %q; want %d hex digits", nonceHex, 2*macNonceBytes)
	}
	key, err := hkdf.Key(sha256.New, poolKey, salt, macInfo, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// macNonceBytes is the size of an object's MAC nonce.
const macNonceBytes = 16

// newMACNonce is a fresh random object MAC nonce, in hex.
func newMACNonce() string {
	b := make([]byte, macNonceBytes)
	cryptorand.Read(b) // never fails: since Go 1.24 it crashes the program rather than return an error
	return hex.EncodeToString(b)
}

// blockNonce is the GCM nonce of block i of an object.
func blockNonce(i int) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n[4:], uint64(i))
	return n
}

// hashList hashes the blocks of one object concurrently, at most one per CPU.
type hashList struct {
	check   blockCheck
	wg      sync.WaitGroup
	mu      sync.Mutex
	digests [][32]byte
	sem     chan struct{}
}

func newHashList(check blockCheck) *hashList {
	return &hashList{check: check, sem: make(chan struct{}, runtime.GOMAXPROCS(0))}
}

// hash hashes block i in the background; data must not change until done
// (if not nil) runs. It waits here for a free core.
func (h *hashList) hash(i int, data []byte, done func()) {
	h.start(i, func() [32]byte { return h.check.sum(i, data) }, done, true)
}

// hashAsync hashes block i as hash does, but returns at once: the hash
// waits for a free core on its own goroutine, not in the caller's.
func (h *hashList) hashAsync(i int, data []byte, done func()) {
	h.start(i, func() [32]byte { return h.check.sum(i, data) }, done, false)
}

// hashAfter hashes block i as hash does, as the continuation of head,
// which holds the block's first bytes (nil: none).
func (h *hashList) hashAfter(i int, head hash.Hash, data []byte, done func()) {
	if head == nil {
		h.hash(i, data, done)
		return
	}
	h.start(i, func() [32]byte { head.Write(data); return digest(head) }, done, true)
}

// start runs sum on a goroutine of its own, at most one per CPU, records
// its digest as block i's, then runs done (if not nil). With waitHere the
// caller waits for a free core; otherwise the goroutine does.
func (h *hashList) start(i int, sum func() [32]byte, done func(), waitHere bool) {
	if waitHere {
		h.sem <- struct{}{}
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if !waitHere {
			h.sem <- struct{}{}
		}
		h.record(i, sum())
		<-h.sem
		if done != nil {
			done()
		}
	}()
}

// digest is the sum of the bytes written into head.
func digest(head hash.Hash) [32]byte {
	var d [32]byte
	head.Sum(d[:0])
	return d
}

// set records block i's hash, all of whose bytes went into head.
func (h *hashList) set(i int, head hash.Hash) { h.record(i, digest(head)) }

// record keeps block i's digest.
func (h *hashList) record(i int, d [32]byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(h.digests) <= i {
		h.digests = append(h.digests, [32]byte{})
	}
	h.digests[i] = d
}

// root waits for the blocks and returns the hex hash list root over blocks
// 0..n-1: the format's hash of their concatenated hashes, or in format 3
// the SHA-256 of their concatenated checksums. No block may start hashing
// once root is called (a WaitGroup's Add must not race its Wait).
func (h *hashList) root(n int) string {
	if h.check.algo == hashXXH3 {
		return h.listRoot(n, 0, sha256.New())
	}
	return h.listRoot(n, 0, h.check.newHead())
}

// macRoot is, like root, the SHA-256 over blocks 0..n-1 of their GMAC tags
// (format 3 on a store with a key); "" without them.
func (h *hashList) macRoot(n int) string {
	if h.check.mac == nil {
		return ""
	}
	return h.listRoot(n, 16, sha256.New())
}

// listRoot hashes with r the digests' bytes from 'from' to the end of
// each: the part holding the tag (16) or all of it (0; 16 bytes of a
// checksum, with no tag after them, are taken as those first 16).
func (h *hashList) listRoot(n, from int, r hash.Hash) string {
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	to := 32
	if h.check.algo == hashXXH3 && from == 0 {
		to = 16
	}
	for i := range n {
		if i < len(h.digests) {
			r.Write(h.digests[i][from:to])
		}
	}
	return hex.EncodeToString(r.Sum(nil))
}

// wait returns once no block is being hashed.
func (h *hashList) wait() { h.wg.Wait() }
