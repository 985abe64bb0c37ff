package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"runtime"
	"sync"

	"github.com/zeebo/blake3"
)

// BlockSize is the unit an object is hashed in. An object's hash in the
// manifest is a hash list: the hash of the concatenated hashes of its
// blocks. That is as strong a check as one hash over the bytes, but every
// block hashes on its own core, so verification keeps up with the disk.
const BlockSize = 8 << 20

// hashAlgo is the hash of a manifest's objects, fixed by its format:
// format 1 hashed with SHA-256; format 2 (FormatVersion) with BLAKE3, which
// runs at over twice SHA-256's speed on one core of these machines (3.5–3.9
// against 1.6 GB/s, both with their CPU's instructions: AVX2 for BLAKE3 (the
// library has no AVX-512 code), SHA-NI for SHA-256), so a checkpoint
// written in the background while training runs takes less of a core from
// it. Both are cryptographic: a manifest signed with the pool's key
// (Store.Sign) vouches for every byte.
//
// BLAKE3 is github.com/zeebo/blake3: on the AMD EPYC VMs of 2026-11-26 it
// hashed 8 MiB at 3.5–4.0 GB/s against 1.7–2.5 for lukechampine.com/blake3
// v1.4.1, used before it (BENCHMARKS.md); on a CPU with AVX-512 (a Zen 5
// VM, 2026-11-27) lukechampine's, which uses it, was the faster: 3.8–4.0
// against 2.7–3.2. Both give the specification's hashes, so checkpoints
// written with either verify with the other
// (TestBLAKE3HashListsMatchTheEarlierLibrary).
type hashAlgo int

const (
	hashSHA256 hashAlgo = iota
	hashBLAKE3
)

// algoOf is the object hash of a manifest format (0 for a format it does not know).
func algoOf(format int) (hashAlgo, bool) {
	switch format {
	case 1:
		return hashSHA256, true
	case 2:
		return hashBLAKE3, true
	}
	return 0, false
}

func (a hashAlgo) String() string {
	if a == hashBLAKE3 {
		return "BLAKE3"
	}
	return "SHA-256"
}

func (a hashAlgo) sum(data []byte) [32]byte {
	if a == hashBLAKE3 {
		return blake3.Sum256(data)
	}
	return sha256.Sum256(data)
}

func (a hashAlgo) new() hash.Hash {
	if a == hashBLAKE3 {
		return blake3.New()
	}
	return sha256.New()
}

// hashList hashes the blocks of one object concurrently, at most one per CPU.
type hashList struct {
	algo    hashAlgo
	wg      sync.WaitGroup
	mu      sync.Mutex
	digests [][32]byte
	sem     chan struct{}
}

func newHashList(algo hashAlgo) *hashList {
	return &hashList{algo: algo, sem: make(chan struct{}, runtime.GOMAXPROCS(0))}
}

// hash hashes block i in the background; data must not change until done
// (if not nil) runs. It waits here for a free core.
func (h *hashList) hash(i int, data []byte, done func()) {
	h.start(i, func() [32]byte { return h.algo.sum(data) }, done, true)
}

// hashAsync hashes block i as hash does, but returns at once: the hash
// waits for a free core on its own goroutine, not in the caller's.
func (h *hashList) hashAsync(i int, data []byte, done func()) {
	h.start(i, func() [32]byte { return h.algo.sum(data) }, done, false)
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
// 0..n-1. No block may start hashing once root is called (a WaitGroup's
// Add must not race its Wait).
func (h *hashList) root(n int) string {
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.algo.new()
	for i := range n {
		if i < len(h.digests) {
			r.Write(h.digests[i][:])
		}
	}
	return hex.EncodeToString(r.Sum(nil))
}

// wait returns once no block is being hashed.
func (h *hashList) wait() { h.wg.Wait() }
