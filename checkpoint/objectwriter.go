package checkpoint

import (
	"errors"
	"fmt"
	"hash"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

type objectWriter struct {
	w      *Writer
	obj    *Object
	sw     *syncedWriter
	hashes *hashList
	writes sync.WaitGroup // blocks being written to a local file
	block  []byte         // the block being filled: its bytes after head
	blocks int            // blocks handed to the hashers
	free   chan []byte    // block buffers neither being written nor hashed
	taken  int            // buffers taken from blockPool, at most cap(free)
	err    error

	// The start of the block being filled, written from the caller's
	// bytes (writeInPlace): how long it is, and its hash so far (nil when
	// the block has none).
	headLen int
	head    hash.Hash
	// inPlaceBytes counts the bytes written from the caller's memory.
	inPlaceBytes int64
}

// writeBuffers bounds the memory of one object being written to a local
// file: the block being filled, one per block being hashed, and one more, so
// that a block is always on its way to the disk while others hash. Other
// stores (S3, memory) take the caller's bytes directly and do without the
// last one.
var writeBuffers = runtime.GOMAXPROCS(0) + 2

// Write writes p to storage while earlier blocks hash on other cores, then
// copies p into the block buffers it hashes next. On a local disk it copies
// p into the blocks only, and each full block is written and hashed at the
// same time, on other goroutines; a megabyte or more, where the block being
// filled holds no copied bytes (and, with direct I/O, at an aligned address
// and position), it writes from p itself (writeInPlace).
func (o *objectWriter) Write(p []byte) (int, error) {
	if o.sw.blocks {
		if err := o.sw.err(); err != nil {
			o.err = err
			return 0, err
		}
		written := 0
		for len(p) > 0 {
			k := o.inPlaceRun(p)
			if k > 0 {
				if err := o.writeInPlace(p[:k:k]); err != nil {
					o.err = err
					return written, err
				}
			} else {
				k = min(len(p), BlockSize-o.headLen-len(o.block))
				o.fill(p[:k])
			}
			written += k
			p = p[k:]
		}
		return written, nil
	}
	n, err := o.sw.Write(p)
	o.fill(p[:n])
	if err != nil {
		o.err = err
	}
	return n, err
}

// fill copies p into the blocks, handing each full one on.
func (o *objectWriter) fill(p []byte) {
	o.obj.Size += int64(len(p))
	for rest := p; len(rest) > 0; {
		k := min(len(rest), BlockSize-o.headLen-len(o.block))
		o.block = append(o.block, rest[:k]...)
		rest = rest[k:]
		if o.headLen+len(o.block) == BlockSize {
			o.flushBlock()
		}
	}
}

// flushBlock hands the block being filled to a hasher and, on a local disk,
// to a writer at the same time, and takes a free buffer for the next. The
// buffer is free again once both are done. Writing while hashing keeps the
// disk busy while the hashes wait for a core: with a CPU-bound process on
// every core, writing each block first and then hashing it left the disk
// idle for the hashes (1 GiB saved at 0.73x dd's direct write).
func (o *objectWriter) flushBlock() {
	b, i, head := o.block, o.blocks, o.head
	off := int64(i)*BlockSize + int64(o.headLen)
	if o.sw.blocks {
		var both atomic.Int32
		both.Store(2)
		release := func() {
			if both.Add(-1) == 0 {
				o.free <- b[:0]
			}
		}
		o.writes.Add(1)
		go func() {
			defer o.writes.Done()
			o.sw.writeBlock(b, off)
			release()
		}()
		o.hashes.hashAfter(i, head, b, release)
	} else {
		o.hashes.hash(i, b, func() { o.free <- b[:0] })
	}
	o.blocks++
	o.head, o.headLen = nil, 0
	o.block = o.nextBuffer()
}

// blockPool holds block buffers (aligned, BlockSize long) between objects:
// an object of a few bytes takes one and gives it back, and a checkpoint
// of many objects neither allocates nor clears 8 MiB for each.
var blockPool = sync.Pool{New: func() any { b := alignedBuffer(BlockSize); return &b }}

// nextBuffer is a free block buffer: one handed back by a hasher or a
// writer, else one more from blockPool while the object holds fewer than
// writeBuffers, else the first to come back. An object takes only what its
// blocks in flight need: before, each took writeBuffers (GOMAXPROCS+2, 130
// on a 128-core host: a GiB) at its start, however small.
func (o *objectWriter) nextBuffer() []byte {
	select {
	case b := <-o.free:
		return b
	default:
	}
	if o.taken < cap(o.free) {
		o.taken++
		return (*blockPool.Get().(*[]byte))[:0]
	}
	return <-o.free
}

// releaseBuffers gives the object's buffers back to blockPool, once every
// block is written and hashed (each buffer is then free, or the one being
// filled).
func (o *objectWriter) releaseBuffers() {
	if o.taken == 0 {
		return
	}
	put := func(b []byte) {
		b = b[:0:BlockSize]
		blockPool.Put(&b)
	}
	for range o.taken - 1 {
		put(<-o.free)
	}
	put(o.block)
	o.block, o.taken = nil, 0
}

// inPlaceMin is the least a Write hands a local file from its own bytes,
// without copying them into a block buffer: a write of a few KiB is
// better copied, written and hashed while the caller goes on.
const inPlaceMin = 1 << 20

// inPlaceRun is how many of p's first bytes go to the local file from p
// itself (writeInPlace): none while the block being filled holds copied
// bytes (the next bytes go after them, in order), and none for a run under
// inPlaceMin. With direct I/O, p must start at an aligned address and
// position, and the run is cut to whole alignments; with a MAC, to whole
// blocks; the rest is copied.
func (o *objectWriter) inPlaceRun(p []byte) int {
	if !o.sw.blocks || len(o.block) > 0 || len(p) < inPlaceMin {
		return 0
	}
	k := len(p)
	if o.sw.direct.Load() {
		if uintptr(unsafe.Pointer(unsafe.SliceData(p)))%directAlign != 0 || o.obj.Size%directAlign != 0 {
			return 0
		}
		k = k / directAlign * directAlign
	}
	if o.hashes.check.wholeBlocks() {
		// A GMAC takes its block whole: whole blocks only, from a
		// block's start; the rest is copied.
		if o.headLen > 0 {
			return 0
		}
		k = k / BlockSize * BlockSize
	}
	if k < inPlaceMin {
		return 0
	}
	return k
}

// writeInPlace writes p (len == cap: nothing past it is touched) at the
// object's end straight from the caller's memory, without the copy into a
// block buffer (which cost a fifth of a save's CPU time: BENCHMARKS.md),
// and returns once every byte of it is written and hashed: a Writer keeps
// nothing of p. This goroutine writes the pieces in order, one at a time,
// as dd does, while other goroutines hash them: a whole block on its own
// (hashList), a piece of a block into the block's running hash (head),
// which the rest of the block, in place or copied, continues. Writing from
// here, rather than from a goroutine per block as copied blocks are, keeps
// the disk as busy under load: with a CPU-bound process on every core, a
// goroutine per piece saved 256 MiB at 0.93-1.28 GB/s against the copying
// path's 1.22-1.54.
func (o *objectWriter) writeInPlace(p []byte) error {
	var hashing sync.WaitGroup
	for len(p) > 0 {
		i, off := o.blocks, int64(o.blocks)*BlockSize+int64(o.headLen)
		k := min(len(p), BlockSize-o.headLen)
		piece := p[:k:k]
		hashing.Add(1)
		if o.headLen == 0 && k == BlockSize {
			o.hashes.hash(i, piece, hashing.Done)
			o.blocks++
		} else {
			if o.head == nil {
				o.head = o.hashes.check.newHead()
			}
			head, full := o.head, o.headLen+k == BlockSize
			go func() {
				defer hashing.Done()
				head.Write(piece)
				if full {
					o.hashes.set(i, head)
				}
			}()
			o.headLen += k
			if full {
				o.blocks++
				o.head, o.headLen = nil, 0
			}
		}
		o.sw.writeBlock(piece, off)
		o.obj.Size += int64(k)
		o.inPlaceBytes += int64(k)
		p = p[k:]
		if o.sw.err() != nil {
			break // the object is lost: write no more of it
		}
	}
	hashing.Wait()
	return o.sw.err()
}

// settle returns once every block handed on is written and hashed.
func (o *objectWriter) settle() {
	o.writes.Wait()
	o.hashes.wait()
}

func (o *objectWriter) Close() error {
	var err error
	if o.sw.blocks {
		if len(o.block) > 0 || o.headLen > 0 || o.blocks == 0 {
			o.flushBlock()
		}
		o.settle() // every block written
		o.sw.size = o.obj.Size
		err = o.sw.Close(o.err)
	} else {
		err = o.sw.Close(o.err)
		if len(o.block) > 0 || o.blocks == 0 {
			o.flushBlock()
		}
	}
	root := o.hashes.root(o.blocks) // every block hashed: every buffer free
	o.releaseBuffers()
	o.w.mu.Lock()
	defer o.w.mu.Unlock()
	o.w.open--
	o.obj.setHash(o.hashes.check.algo, root)
	o.obj.MAC = o.hashes.macRoot(o.blocks)
	if err != nil {
		err = fmt.Errorf("checkpoint: writing %s: %w", o.obj.Name, err)
		o.w.failed = errors.Join(o.w.failed, err)
	}
	return err
}
