package dataset

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/durabletrain/durabletrain/internal/blobopen"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"github.com/durabletrain/durabletrain/spec"
)

// DefaultURL is where Debian's dataset-fashion-mnist package installs the files.
const DefaultURL = spec.DefaultDatasetURL

// Classes is the number of Fashion-MNIST labels.
const Classes = 10

const (
	idxImagesMagic = 0x00000803 // unsigned bytes, 3 dimensions
	idxLabelsMagic = 0x00000801 // unsigned bytes, 1 dimension
	maxExamples    = 10_000_000
	maxValues      = maxExamples * 28 * 28 // bytes of one IDX file's data
)

// Split names one half of the data set.
type Split string

const (
	Train Split = "train"
	Test  Split = "test"
)

// Files returns the object names of a split, as Fashion-MNIST publishes them.
func (s Split) Files() (images, labels string) {
	prefix := "train"
	if s == Test {
		prefix = "t10k"
	}
	return prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz"
}

// Set holds one split in memory: Images is Len() rows of Rows*Cols pixels scaled to [0, 1].
type Set struct {
	Images     []float32
	Labels     []uint8
	Rows, Cols int
}

// Len is the number of examples.
func (s *Set) Len() int { return len(s.Labels) }

// Features is the number of inputs per example.
func (s *Set) Features() int { return s.Rows * s.Cols }

// Gather copies the examples at idx into x (len(idx) rows) and their labels into y.
func (s *Set) Gather(idx []int32, x []float32, y []uint8) {
	f := s.Features()
	for i, j := range idx {
		copy(x[i*f:(i+1)*f], s.Images[int(j)*f:(int(j)+1)*f])
		y[i] = s.Labels[j]
	}
}

// Head returns the first n examples (all of them if n >= Len).
func (s *Set) Head(n int) *Set {
	n = min(n, s.Len())
	return &Set{Images: s.Images[:n*s.Features()], Labels: s.Labels[:n], Rows: s.Rows, Cols: s.Cols}
}

// Load reads one split from the bucket at url and validates it.
func Load(ctx context.Context, url string, split Split) (*Set, error) {
	if split != Train && split != Test {
		return nil, fmt.Errorf("dataset: split %q; want %q or %q", split, Train, Test)
	}
	if err := bloburl.Check("dataset URL", url); err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	b, err := blobopen.Open(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("dataset: opening %s: %w%s", url, err, installHint(url))
	}
	defer b.Close()
	return loadFrom(ctx, b, url, split)
}

// loadFrom reads one split from b, opened from url. A read that fails
// (a store that errs or stalls: blobwatch) returns the store's error,
// which says so (blobwatch.IsStoreFailure): it says nothing about the data.
func loadFrom(ctx context.Context, raw *blob.Bucket, url string, split Split) (*Set, error) {
	b := blobwatch.Wrap(raw, url, blobwatch.StallTimeout(ctx))
	imagesName, labelsName := split.Files()
	limit := MemoryLimit(ctx)
	// In memory an image's pixel takes a float32 and a label a byte.
	pixels, dims, err := readIDX(ctx, b, url, imagesName, idxImagesMagic, 3, 4, limit)
	if err != nil {
		return nil, err
	}
	if limit > 0 {
		limit = max(1, limit-4*int64(len(pixels)))
	}
	labels, ldims, err := readIDX(ctx, b, url, labelsName, idxLabelsMagic, 1, 1, limit)
	if err != nil {
		return nil, err
	}
	if dims[0] != ldims[0] {
		return nil, fmt.Errorf("dataset: %s in %s has %d images but %s has %d labels; want the same count", imagesName, url, dims[0], labelsName, ldims[0])
	}
	for i, l := range labels {
		if l >= Classes {
			return nil, fmt.Errorf("dataset: %s in %s: label %d of example %d; want 0..%d", labelsName, url, l, i, Classes-1)
		}
	}
	s := &Set{Images: make([]float32, len(pixels)), Labels: labels, Rows: dims[1], Cols: dims[2]}
	for i, p := range pixels {
		s.Images[i] = float32(p) / 255
	}
	return s, nil
}

// readIDX reads a gzip-compressed IDX file of unsigned bytes with the given
// magic. Its values will take loaded bytes each in memory; where limit is
// positive, a header whose values would take more than limit is refused
// before any is read. Memory follows the data that arrives, not the
// header's claim: a file of a few bytes whose header claims gigabytes is
// refused as truncated having allocated little.
func readIDX(ctx context.Context, b *blobwatch.Bucket, url, name string, magic uint32, ndims int, loaded, limit int64) ([]byte, []int, error) {
	fail := func(format string, args ...any) ([]byte, []int, error) {
		return nil, nil, fmt.Errorf("dataset: %s in %s: "+format, append([]any{name, url}, args...)...)
	}
	r, err := b.NewReader(ctx, name, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return fail("not found%s", installHint(url))
		}
		return fail("%w", err)
	}
	defer r.Close()
	z, err := gzip.NewReader(bufio.NewReader(r))
	if blobwatch.IsStoreFailure(err) {
		return fail("%w", err)
	}
	if err != nil {
		return fail("not a gzip file (%v); want the .gz files as Fashion-MNIST publishes them", err)
	}
	head := make([]byte, 4+4*ndims)
	if _, err := io.ReadFull(z, head); err != nil {
		return fail("header: %w", err)
	}
	if got := binary.BigEndian.Uint32(head); got != magic {
		return fail("magic number %#08x; want %#08x (an IDX file of unsigned bytes with %d dimensions)", got, magic, ndims)
	}
	dims := make([]int, ndims)
	total := 1
	for i := range dims {
		dims[i] = int(binary.BigEndian.Uint32(head[4+4*i:]))
		if dims[i] <= 0 || dims[i] > maxExamples {
			return fail("dimension %d is %d; want 1..%d", i, dims[i], maxExamples)
		}
		// Checked before each product, which would otherwise wrap: three
		// dimensions of 2^22, 2^22 and 2^20 multiply to 0 in an int.
		if total > maxValues/dims[i] {
			return fail("dimensions %v hold more than the %d values this reader accepts", dims[:i+1], maxValues)
		}
		total *= dims[i]
	}
	if need := loaded * int64(total); limit > 0 && need > limit {
		return fail("dimensions %v hold %d values, %d MiB in memory; this worker allows %d MiB for a data set, both splits together (-max-dataset-memory)",
			dims, total, need>>20, limit>>20)
	}
	data, err := readUpTo(z, total)
	if err != nil {
		return fail("truncated: %d of %d bytes of data (%w)", len(data), total, err)
	}
	if n, _ := z.Read(make([]byte, 1)); n != 0 {
		return fail("more data than its header's %v dimensions", dims)
	}
	return data, dims, nil
}

// readUpTo reads n bytes from r into a buffer that grows as they arrive,
// doubling from 1 MiB: what a hostile header claims costs nothing until
// the bytes are there.
func readUpTo(r io.Reader, n int) ([]byte, error) {
	data := make([]byte, 0, min(n, 1<<20))
	for len(data) < n {
		if len(data) == cap(data) {
			data = slices.Grow(data, min(cap(data), n-len(data)))
		}
		k, err := r.Read(data[len(data):min(cap(data), n)])
		data = data[:len(data)+k]
		if err == io.EOF && len(data) < n {
			return data, io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return data, err
		}
	}
	return data, nil
}

type memoryLimitKey struct{}

// WithMemoryLimit returns a context under which Load and LoadIDX refuse a
// data set whose examples would take more than limit bytes in memory
// (LoadIDX: both splits together), from its files' headers, before they
// read its data. A registered format's loader reads it with MemoryLimit.
// A limit of 0 or less sets none (the format's own bounds remain).
func WithMemoryLimit(ctx context.Context, limit int64) context.Context {
	return context.WithValue(ctx, memoryLimitKey{}, limit)
}

// MemoryLimit is the limit ctx carries (WithMemoryLimit), 0 if none.
func MemoryLimit(ctx context.Context) int64 {
	limit, _ := ctx.Value(memoryLimitKey{}).(int64)
	return max(0, limit)
}

// Bytes is what the set's examples take in memory.
func (s *Set) Bytes() int64 { return 4*int64(len(s.Images)) + int64(len(s.Labels)) }

// Write stores a split at url in the same format Load reads (used to make subsets).
func Write(ctx context.Context, url string, split Split, s *Set) error {
	if err := bloburl.Check("dataset URL", url); err != nil {
		return fmt.Errorf("dataset: %w", err)
	}
	b, err := blobwatch.Open(ctx, url)
	if err != nil {
		return fmt.Errorf("dataset: opening %s: %w", url, err)
	}
	defer b.Close()
	imagesName, labelsName := split.Files()
	pixels := make([]byte, len(s.Images))
	for i, v := range s.Images {
		pixels[i] = byte(v*255 + 0.5)
	}
	if err := writeIDX(ctx, b, imagesName, idxImagesMagic, []int{s.Len(), s.Rows, s.Cols}, pixels); err != nil {
		return err
	}
	return writeIDX(ctx, b, labelsName, idxLabelsMagic, []int{s.Len()}, s.Labels)
}

func writeIDX(ctx context.Context, b *blobwatch.Bucket, name string, magic uint32, dims []int, data []byte) error {
	w, err := b.NewWriter(ctx, name, nil)
	if err != nil {
		return err
	}
	z, _ := gzip.NewWriterLevel(w, gzip.BestCompression)
	head := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		head = binary.BigEndian.AppendUint32(head, uint32(d))
	}
	_, err = z.Write(append(head, data...))
	return errors.Join(err, z.Close(), w.Close())
}

func installHint(url string) string {
	if url == DefaultURL {
		return "; install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist), or set dataset.url to a bucket holding the four Fashion-MNIST .gz files"
	}
	return "; want a bucket holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz"
}
