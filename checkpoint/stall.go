package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"gocloud.dev/blob"
)

// A store that stops answering (an S3 server that hangs, a partition
// between worker and store, a load balancer that holds the connection)
// would hold a save or a restore for ever: the worker's heartbeat goes on
// beating while it waits, so nothing above it notices either. Every call to
// storage is therefore watched: one that moves nothing for the store's
// stall timeout is cancelled and fails with a *StallError, the store's
// fault, never the checkpoint's (no checkpoint is skipped or deleted for
// it). Only time spent inside a call counts: a writer waiting for its
// caller's next bytes is not stalled.

// DefaultStallTimeout is how long a call to storage may move nothing before
// it fails, unless SetStallTimeout says otherwise.
const DefaultStallTimeout = 2 * time.Minute

// StallError says a call to storage moved nothing for the stall timeout.
type StallError struct {
	URL   string        // the store
	Op    string        // what waited: "writing run/ckpt-…/state.bin"
	After time.Duration // the stall timeout
}

func (e *StallError) Error() string {
	return fmt.Sprintf("checkpoint: storage %s moved nothing for %s while %s: the store is hung or unreachable (checkpoint.stall_timeout)", e.URL, e.After, e.Op)
}

// SetStallTimeout sets how long a call to storage may move nothing before it
// fails with a *StallError; 0 or less: DefaultStallTimeout.
func (s *Store) SetStallTimeout(d time.Duration) {
	if d <= 0 {
		d = DefaultStallTimeout
	}
	s.bucket.stall = d
}

// bucket is the store's blob.Bucket with every call watched for stalls.
type bucket struct {
	b     *blob.Bucket
	url   string
	stall time.Duration
}

// watchdog fails a call to storage that moves nothing for a while: armed
// while a call runs, it cancels the call's context with a *StallError as
// the cause when it fires.
type watchdog struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	after  time.Duration
}

// watch makes a watchdog for op, not yet armed.
func (b *bucket) watch(ctx context.Context, op string) *watchdog {
	after := b.stall
	if after <= 0 {
		after = DefaultStallTimeout
	}
	ctx, cancel := context.WithCancelCause(ctx)
	w := &watchdog{ctx: ctx, cancel: cancel, after: after}
	w.timer = time.AfterFunc(after, func() { cancel(&StallError{URL: b.url, Op: op, After: after}) })
	w.timer.Stop()
	return w
}

// arm starts (or restarts) the clock of a call.
func (w *watchdog) arm() { w.timer.Reset(w.after) }

// disarm stops it once the call has returned err, and returns err, or the
// stall that ended the call.
func (w *watchdog) disarm(err error) error {
	w.timer.Stop()
	return w.why(err)
}

// why is err, or the *StallError that caused it.
func (w *watchdog) why(err error) error {
	var stall *StallError
	if err != nil && err != io.EOF && errors.As(context.Cause(w.ctx), &stall) {
		return stall
	}
	return err
}

// close ends the watch and its context.
func (w *watchdog) close() {
	w.timer.Stop()
	w.cancel(nil)
}

// once runs one call under a watchdog of its own.
func (b *bucket) once(ctx context.Context, op string, call func(context.Context) error) error {
	w := b.watch(ctx, op)
	defer w.close()
	w.arm()
	return w.disarm(call(w.ctx))
}

func (b *bucket) Close() error { return b.b.Close() }

func (b *bucket) Attributes(ctx context.Context, key string) (attrs *blob.Attributes, err error) {
	err = b.once(ctx, "asking for "+key, func(ctx context.Context) error {
		attrs, err = b.b.Attributes(ctx, key)
		return err
	})
	return attrs, err
}

func (b *bucket) Delete(ctx context.Context, key string) error {
	return b.once(ctx, "deleting "+key, func(ctx context.Context) error { return b.b.Delete(ctx, key) })
}

func (b *bucket) WriteAll(ctx context.Context, key string, data []byte, opts *blob.WriterOptions) error {
	return b.once(ctx, "writing "+key, func(ctx context.Context) error { return b.b.WriteAll(ctx, key, data, opts) })
}

// ReadAll reads key whole: small objects only (an owner record, a shard's list).
func (b *bucket) ReadAll(ctx context.Context, key string) ([]byte, error) {
	r, err := b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// List lists as blob.Bucket.List does; each page is watched.
func (b *bucket) List(opts *blob.ListOptions) *lister {
	return &lister{it: b.b.List(opts), b: b, op: "listing " + opts.Prefix}
}

type lister struct {
	it *blob.ListIterator
	b  *bucket
	op string
}

func (l *lister) Next(ctx context.Context) (obj *blob.ListObject, err error) {
	err = l.b.once(ctx, l.op, func(ctx context.Context) error {
		obj, err = l.it.Next(ctx)
		return err
	})
	return obj, err
}

// reader is a blob.Reader whose every Read is watched.
type reader struct {
	r   *blob.Reader
	dog *watchdog
}

func (b *bucket) NewReader(ctx context.Context, key string, opts *blob.ReaderOptions) (*reader, error) {
	return b.NewRangeReader(ctx, key, 0, -1, opts)
}

func (b *bucket) NewRangeReader(ctx context.Context, key string, off, n int64, opts *blob.ReaderOptions) (*reader, error) {
	dog := b.watch(ctx, "reading "+key)
	dog.arm()
	r, err := b.b.NewRangeReader(dog.ctx, key, off, n, opts)
	if err = dog.disarm(err); err != nil {
		dog.close()
		return nil, err
	}
	return &reader{r: r, dog: dog}, nil
}

func (r *reader) Read(p []byte) (int, error) {
	r.dog.arm()
	n, err := r.r.Read(p)
	return n, r.dog.disarm(err)
}

// Size is the object's size.
func (r *reader) Size() int64 { return r.r.Size() }

func (r *reader) Close() error {
	err := r.r.Close()
	r.dog.close()
	return err
}

// writer is a blob.Writer whose every Write and whose Close are watched.
type writer struct {
	w   *blob.Writer
	dog *watchdog
}

func (b *bucket) NewWriter(ctx context.Context, key string, opts *blob.WriterOptions) (*writer, error) {
	dog := b.watch(ctx, "writing "+key)
	dog.arm()
	w, err := b.b.NewWriter(dog.ctx, key, opts)
	if err = dog.disarm(err); err != nil {
		dog.close()
		return nil, err
	}
	return &writer{w: w, dog: dog}, nil
}

func (w *writer) Write(p []byte) (int, error) {
	w.dog.arm()
	n, err := w.w.Write(p)
	return n, w.dog.disarm(err)
}

// Close publishes the object (or discards it, if its context was
// cancelled): on S3 the upload's last parts and its completion happen here.
func (w *writer) Close() error {
	w.dog.arm()
	err := w.w.Close()
	err = w.dog.disarm(err)
	w.dog.close()
	return err
}
