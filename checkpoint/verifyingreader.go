package checkpoint

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// verifyingReader streams an object while checking it against its manifest
// entry. Read-ahead goroutines (streams) fetch its blocks with range reads,
// block i by stream i mod streams, each into a small ring of its own
// buffers, so that a disk or a store serves several requests at once; each
// block hashes on a free core from the moment it arrives, while the reader
// takes its bytes, and its buffer is free once both are done. Reading to the end
// returns a *CorruptError instead of io.EOF if the size or the hash list
// root differs from the manifest.
type verifyingReader struct {
	key     string
	obj     Object
	c       *Checkpoint
	streams []readStream
	cancel  context.CancelFunc
	stop    chan struct{}
	reading sync.WaitGroup
	hashes  *hashList
	blocks  int // blocks handed out (each hashing since it arrived)
	total   int // blocks of the object: at least one (an empty object is one empty block)
	cur     readChunk
	off     int
	n       int64
	err     error
	closed  bool
	stopped bool // the read-ahead has ended (stopReadAhead)
}

// readStream is one read-ahead goroutine's queue and buffers.
type readStream struct {
	filled chan readChunk
	free   chan []byte
}

type readChunk struct {
	buf []byte
	err error // io.EOF with the object's last block
	// handedOut frees buf once the reader is done with it; the hash
	// started when the block arrived frees it too (readAhead).
	handedOut func()
}

// streamBuffers per read-ahead stream: the block being read, one being
// handed out and hashed, one waiting (or still hashing).
const streamBuffers = 3

func newVerifyingReader(ctx context.Context, key string, o Object, c *Checkpoint) (_ *verifyingReader, err error) {
	algo, _ := algoOf(c.Manifest.Format)
	check := blockCheck{algo: algo}
	if algo == hashXXH3 && c.s.key != nil {
		// The manifest's signature and every object's MAC were checked
		// when it was read (Store.manifest): the key authenticates each block.
		// The nonce is well formed (hashIs): an error here is this
		// process's (GODEBUG=fips140=only refuses GCM with nonces of our
		// choosing), not the checkpoint's, so it is not a CorruptError.
		check.mac, err = objectMAC(c.s.key, o.MACNonce)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s/%s: checking object %s's MAC: %w", c.Manifest.Run, c.Manifest.ID, o.Name, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	total := max(1, int((o.Size+BlockSize-1)/BlockSize))
	v := &verifyingReader{key: key, obj: o, c: c, hashes: newHashList(check), cancel: cancel,
		stop: make(chan struct{}), total: total, streams: make([]readStream, min(cmp.Or(c.s.readStreams, readStreamsFor(c.s.url, algo)), total))}
	size := int(min(o.Size, BlockSize))
	for k := range v.streams {
		st := readStream{filled: make(chan readChunk, streamBuffers), free: make(chan []byte, streamBuffers)}
		for range streamBuffers {
			if c.s.directIO {
				st.free <- alignedBuffer(size)[:size]
			} else {
				st.free <- make([]byte, size)
			}
		}
		v.streams[k] = st
		v.reading.Add(1)
		go v.readAhead(ctx, k)
	}
	return v, nil
}

// readAhead reads blocks k, k+streams, ... of the object, each with its own
// range read, so that chunk i is block i of the hash list. The object's last
// block, or a short one, carries io.EOF; a failed read carries its error.
func (v *verifyingReader) readAhead(ctx context.Context, k int) {
	defer v.reading.Done()
	st := v.streams[k]
	for i := k; i < v.total; i += len(v.streams) {
		var buf []byte
		select {
		case buf = <-st.free:
		case <-v.stop:
			return
		}
		off := int64(i) * BlockSize
		want := int(min(BlockSize, v.obj.Size-off))
		n, err := v.readBlock(ctx, off, buf[:want])
		if err == nil && i == v.total-1 {
			err = io.EOF
		}
		// The block hashes from the moment it arrives, while the reader
		// takes its bytes, not after: with the hash waiting for the
		// reader, loads ran at about 2 GB/s on a 2-core VM whose disk read
		// 2.6 (BENCHMARKS.md). Its buffer is free once both are done.
		chunk := readChunk{buf: buf[:n], err: err}
		if n > 0 || v.obj.Size == 0 {
			b, free := buf, st.free
			var both atomic.Int32
			both.Store(2)
			release := func() {
				if both.Add(-1) == 0 {
					free <- b[:cap(b)]
				}
			}
			v.hashes.hashAsync(i, b[:n], release)
			chunk.handedOut = release
		} else {
			chunk.handedOut = func() { st.free <- buf[:cap(buf)] }
		}
		select {
		case st.filled <- chunk:
		case <-v.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// readBlock fills buf from offset off; a short read (the object shrank)
// returns io.EOF with what it got. On a local disk it reads the block
// directly (O_DIRECT: buf's capacity is aligned, and so is the length it
// asks for) unless the page cache holds all of it already.
func (v *verifyingReader) readBlock(ctx context.Context, off int64, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	want, ask := len(buf), len(buf)
	var opts *blob.ReaderOptions
	var direct *os.File
	if v.c.s.directIO {
		ask = roundUp(want, directAlign) // a whole last block: reading past the end is a short read
		opts = &blob.ReaderOptions{BeforeRead: func(as func(any) bool) error {
			var f *os.File
			if as(&f) && canDirect(f) && !cached(f, off, int64(want)) && setDirect(f, true) == nil {
				direct = f
			}
			return nil
		}}
	}
	r, err := v.c.s.bucket.NewRangeReader(ctx, v.key, off, int64(ask), opts)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return 0, io.EOF // removed since it was opened: short, hence corrupt
		}
		return 0, err
	}
	defer r.Close()
	buf = buf[:ask]
	n, err := io.ReadAtLeast(r, buf, want)
	if err != nil && direct != nil && isDirectRefused(err) {
		// The file system took O_DIRECT and then refused the read: the rest through the cache.
		if err = setDirect(direct, false); err == nil {
			var m int
			m, err = io.ReadAtLeast(r, buf[n:], want-n)
			n += m
		}
	}
	n = min(n, want)
	if v.c.read != nil {
		v.c.read.Add(int64(n))
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = io.EOF
	}
	return n, err
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.closed {
		return 0, fmt.Errorf("reading object %s: %w", v.obj.Name, os.ErrClosed)
	}
	if err := v.advance(); err != nil {
		return 0, err
	}
	n := copy(p, v.cur.buf[v.off:])
	v.off += n
	v.n += int64(n)
	return n, nil
}

// WriteTo writes the object to w block by block, straight from the buffer
// each block was read into, so that io.Copy pays no copy into a buffer of
// its own (dd's reads to /dev/null pay none either). At the end it returns
// nil, or a *CorruptError if the size or the hash list root differs from
// the manifest: as with Read, w has been given the bytes by then, and a
// caller must keep what it wrote until WriteTo has returned nil.
func (v *verifyingReader) WriteTo(w io.Writer) (int64, error) {
	if v.closed {
		return 0, fmt.Errorf("reading object %s: %w", v.obj.Name, os.ErrClosed)
	}
	var written int64
	for {
		if err := v.advance(); err == io.EOF {
			return written, nil
		} else if err != nil {
			return written, err
		}
		n, err := w.Write(v.cur.buf[v.off:])
		v.off += n
		v.n += int64(n)
		written += int64(n)
		if err == nil && v.off < len(v.cur.buf) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return written, err
		}
	}
}

// advance makes the current block one with bytes left to hand out: it hands
// a block that has been read out to a hasher (which frees its buffer) and
// takes the next from its stream. At the object's end it returns io.EOF, or
// the *CorruptError that the size or the hash list root calls for.
func (v *verifyingReader) advance() error {
	for v.err == nil && v.off == len(v.cur.buf) {
		if v.cur.buf != nil {
			if len(v.cur.buf) > 0 || v.obj.Size == 0 {
				v.blocks++ // hashing since it arrived (readAhead)
			}
			v.cur.handedOut()
			v.cur.buf = nil
		}
		if v.cur.err != nil {
			v.err = v.finish(v.cur.err)
			break
		}
		v.cur, v.off = <-v.streams[v.blocks%len(v.streams)].filled, 0
		if v.cur.buf == nil {
			v.cur.buf = []byte{} // handed out (and hashed) even when empty
		}
	}
	return v.err
}

// finish checks the whole object once storage has reported its end (or an
// error). The other streams may still be reading blocks past that end (an
// object that shrank or vanished ends early on one stream only): they stop
// before the root is taken, so that no block starts hashing while it is.
func (v *verifyingReader) finish(readErr error) error {
	v.stopReadAhead()
	got := v.hashes.root(v.blocks)
	switch {
	case readErr != io.EOF:
		return fmt.Errorf("reading object %s: %w", v.obj.Name, readErr)
	case v.n != v.obj.Size:
		return v.c.corrupt("object %s ended after %d bytes; the manifest says %d", v.obj.Name, v.n, v.obj.Size)
	case got != v.obj.Hash():
		return v.c.corrupt("object %s has %s hash list root %s; the manifest says %s", v.obj.Name, v.hashes.check.algo, got, v.obj.Hash())
	case v.hashes.check.mac != nil && v.hashes.macRoot(v.blocks) != v.obj.MAC:
		return v.c.corrupt("object %s fails its GMAC under the pool key: forged, or damaged", v.obj.Name)
	}
	return io.EOF
}

func (v *verifyingReader) Close() error {
	if !v.closed {
		v.closed = true
		v.stopReadAhead()
		v.hashes.wait()
	}
	return nil
}

// stopReadAhead ends the read-ahead goroutines and waits for them: none
// starts a hash after it returns.
func (v *verifyingReader) stopReadAhead() {
	if !v.stopped {
		v.stopped = true
		close(v.stop)
		v.cancel() // a range read in flight ends now
		v.reading.Wait()
	}
}
