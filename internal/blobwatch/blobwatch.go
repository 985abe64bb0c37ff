// Package blobwatch owns the calls durabletrain makes to blob storage
// (checkpoints, data sets): a gocloud.dev/blob Bucket whose every call is
// watched, so that a store that stops answering fails the call instead of
// holding it for ever, and whose every failure says it is the store's.
//
// A store that stops answering (an S3 server that hangs, a partition
// between worker and store, a load balancer that holds the connection)
// would hold a save, a restore or a data set's load for ever: the worker's
// heartbeat goes on beating while it waits, so nothing above it notices
// either. A call that moves nothing for the stall timeout is cancelled and
// fails with a *StallError. Only time spent inside a call counts: a writer
// waiting for its caller's next bytes, or a reader its caller's next Read,
// is not stalled.
//
// A failure of a call (a stall, a 503, a reset connection, a refused
// credential) is a *StoreError: it says nothing about what the store
// holds, so no checkpoint is skipped or deleted for one, and no run is
// blamed for it. A missing object is an answer, not a failure: it keeps
// gcerrors.NotFound and is not a *StoreError.
package blobwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/durabletrain/durabletrain/internal/blobopen"
)

// DefaultStallTimeout is how long a call to storage may move nothing before
// it fails, unless the bucket or the context says otherwise.
const DefaultStallTimeout = 2 * time.Minute

// StallError says a call to storage moved nothing for the stall timeout.
type StallError struct {
	URL   string        // the store
	Op    string        // what waited: "writing run/ckpt-…/state.bin"
	After time.Duration // the stall timeout
}

func (e *StallError) Error() string {
	return fmt.Sprintf("storage %s moved nothing for %s while %s: the store is hung or unreachable (the worker's -storage-stall-timeout)", e.URL, e.After, e.Op)
}

// StoreError is a call to storage that failed: the store's failure, not
// the data's.
type StoreError struct{ Err error }

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// IsStoreFailure says whether err is (or wraps) a call to storage that failed.
func IsStoreFailure(err error) bool {
	var se *StoreError
	return errors.As(err, &se)
}

type stallKey struct{}

// WithStallTimeout makes d the stall timeout of the buckets opened with ctx (Open).
func WithStallTimeout(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, stallKey{}, d)
}

// StallTimeout is the stall timeout ctx carries, or DefaultStallTimeout.
func StallTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(stallKey{}).(time.Duration); ok && d > 0 {
		return d
	}
	return DefaultStallTimeout
}

// Bucket is a blob.Bucket with every call watched.
type Bucket struct {
	b     *blob.Bucket
	url   string
	stall time.Duration
}

// Open opens the bucket at url (blob.OpenBucket), with ctx's stall timeout.
func Open(ctx context.Context, url string) (*Bucket, error) {
	b, err := blobopen.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	return Wrap(b, url, StallTimeout(ctx)), nil
}

// Wrap watches b, opened from url (which errors name), with stall timeout
// stall (0 or less: DefaultStallTimeout).
func Wrap(b *blob.Bucket, url string, stall time.Duration) *Bucket {
	w := &Bucket{b: b, url: url}
	w.SetStallTimeout(stall)
	return w
}

// SetStallTimeout sets how long a call may move nothing before it fails
// with a *StallError; 0 or less: DefaultStallTimeout. Set it before the
// bucket is used.
func (b *Bucket) SetStallTimeout(d time.Duration) {
	if d <= 0 {
		d = DefaultStallTimeout
	}
	b.stall = d
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
func (b *Bucket) watch(ctx context.Context, op string) *watchdog {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &watchdog{ctx: ctx, cancel: cancel, after: b.stall}
	w.timer = time.AfterFunc(b.stall, func() { cancel(&StallError{URL: b.url, Op: op, After: b.stall}) })
	w.timer.Stop()
	return w
}

// arm starts (or restarts) the clock of a call.
func (w *watchdog) arm() { w.timer.Reset(w.after) }

// disarm stops it once the call has returned err, and returns err as a
// *StoreError (the stall that ended the call, if it was one), or nil, or
// io.EOF, or the store's answer (gcerrors.NotFound, FailedPrecondition), or
// the caller's cancellation.
func (w *watchdog) disarm(err error) error {
	w.timer.Stop()
	return w.failure(err)
}

func (w *watchdog) failure(err error) error {
	var stall *StallError
	switch {
	case err == nil || err == io.EOF:
		return err
	case errors.As(context.Cause(w.ctx), &stall):
		return &StoreError{Err: stall}
	case w.ctx.Err() != nil, IsStoreFailure(err):
		return err // the caller cancelled it; or said already
	}
	switch gcerrors.Code(err) {
	case gcerrors.NotFound, gcerrors.FailedPrecondition, gcerrors.AlreadyExists:
		return err // an answer: no such object, or a conditional write that lost
	}
	return &StoreError{Err: err}
}

// close ends the watch and its context.
func (w *watchdog) close() {
	w.timer.Stop()
	w.cancel(nil)
}

// once runs one call under a watchdog of its own.
func (b *Bucket) once(ctx context.Context, op string, call func(context.Context) error) error {
	w := b.watch(ctx, op)
	defer w.close()
	w.arm()
	return w.disarm(contained(b.url, op, func() error { return call(w.ctx) }))
}

// contained runs a driver's call, and turns a panic in it into an error:
// a store that fails in a way its driver did not expect must fail the
// call, not the worker. (gocloud.dev v0.47's azureblob writer dereferences
// a pipe its upload goroutine has just set to nil when an upload fails at
// once, as against a store that cannot be reached; v0.48 fixes it, but
// needs an OpenTelemetry the Temporal server we embed does not build with.)
func contained(url, op string, call func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("storage %s: the blob driver panicked while %s: %v", url, op, p)
		}
	}()
	return call()
}

// Close releases the bucket.
func (b *Bucket) Close() error { return b.b.Close() }

// Attributes is blob.Bucket.Attributes, watched.
func (b *Bucket) Attributes(ctx context.Context, key string) (attrs *blob.Attributes, err error) {
	err = b.once(ctx, "asking for "+key, func(ctx context.Context) error {
		attrs, err = b.b.Attributes(ctx, key)
		return err
	})
	return attrs, err
}

// Delete is blob.Bucket.Delete, watched.
func (b *Bucket) Delete(ctx context.Context, key string) error {
	return b.once(ctx, "deleting "+key, func(ctx context.Context) error { return b.b.Delete(ctx, key) })
}

// WriteAll is blob.Bucket.WriteAll, watched as one call: small objects only.
// A conditional write that lost keeps its gcerrors code (FailedPrecondition).
func (b *Bucket) WriteAll(ctx context.Context, key string, data []byte, opts *blob.WriterOptions) error {
	return b.once(ctx, "writing "+key, func(ctx context.Context) error { return b.b.WriteAll(ctx, key, data, opts) })
}

// ReadAll reads key whole, refusing one of more than limit bytes before
// it reads it (and one that grows past limit while it does): small
// objects only (an owner record, a shard's list), which whoever can write
// the bucket could make huge.
func (b *Bucket) ReadAll(ctx context.Context, key string, limit int64) ([]byte, error) {
	r, err := b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if r.Size() > limit {
		return nil, fmt.Errorf("%s has %d bytes; at most %d are read", key, r.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && int64(len(data)) > limit {
		err = fmt.Errorf("%s has more than %d bytes; at most %d are read", key, limit, limit)
	}
	return data, err
}

// List lists as blob.Bucket.List does; each page is watched.
func (b *Bucket) List(opts *blob.ListOptions) *Lister {
	return &Lister{it: b.b.List(opts), b: b, op: "listing " + opts.Prefix}
}

// Lister is a blob.ListIterator whose every call is watched.
type Lister struct {
	it *blob.ListIterator
	b  *Bucket
	op string
}

// Next is blob.ListIterator.Next, watched.
func (l *Lister) Next(ctx context.Context) (obj *blob.ListObject, err error) {
	err = l.b.once(ctx, l.op, func(ctx context.Context) error {
		obj, err = l.it.Next(ctx)
		return err
	})
	return obj, err
}

// Reader is a blob.Reader whose every Read is watched.
type Reader struct {
	r   *blob.Reader
	dog *watchdog
}

// NewReader is blob.Bucket.NewReader, watched until Close.
func (b *Bucket) NewReader(ctx context.Context, key string, opts *blob.ReaderOptions) (*Reader, error) {
	return b.NewRangeReader(ctx, key, 0, -1, opts)
}

// NewRangeReader is blob.Bucket.NewRangeReader, watched until Close.
func (b *Bucket) NewRangeReader(ctx context.Context, key string, off, n int64, opts *blob.ReaderOptions) (*Reader, error) {
	dog := b.watch(ctx, "reading "+key)
	dog.arm()
	r, err := b.b.NewRangeReader(dog.ctx, key, off, n, opts)
	if err = dog.disarm(err); err != nil {
		dog.close()
		return nil, err
	}
	return &Reader{r: r, dog: dog}, nil
}

func (r *Reader) Read(p []byte) (int, error) {
	r.dog.arm()
	n, err := r.r.Read(p)
	return n, r.dog.disarm(err)
}

// Size is the object's size.
func (r *Reader) Size() int64 { return r.r.Size() }

// Close ends the read.
func (r *Reader) Close() error {
	err := r.r.Close()
	r.dog.close()
	return err
}

// Writer is a blob.Writer whose every Write, and whose Close, are watched.
type Writer struct {
	w   *blob.Writer
	dog *watchdog
	url string
}

// NewWriter is blob.Bucket.NewWriter, watched until Close. Cancelling ctx
// before Close discards the object, as with blob.Writer.
func (b *Bucket) NewWriter(ctx context.Context, key string, opts *blob.WriterOptions) (*Writer, error) {
	dog := b.watch(ctx, "writing "+key)
	dog.arm()
	w, err := b.b.NewWriter(dog.ctx, key, opts)
	if err = dog.disarm(err); err != nil {
		dog.close()
		return nil, err
	}
	return &Writer{w: w, dog: dog, url: b.url}, nil
}

func (w *Writer) Write(p []byte) (n int, err error) {
	w.dog.arm()
	err = contained(w.url, "writing", func() (err error) { n, err = w.w.Write(p); return err })
	return n, w.dog.disarm(err)
}

// Close publishes the object (or discards it, if its context was
// cancelled): on S3 the upload's last parts and its completion happen here.
func (w *Writer) Close() error {
	w.dog.arm()
	err := w.dog.disarm(contained(w.url, "closing a writer", w.w.Close))
	w.dog.close()
	return err
}
