package dataset

import (
	"context"

	"github.com/durabletrain/durabletrain/internal/registry"
)

// Loader reads a data set's train and test splits from a blob URL, and
// validates them. A format's loader is looked up by spec.dataset.format.
// The worker calls it under a memory limit (MemoryLimit(ctx)): a loader
// should refuse, before reading the data, a data set whose examples would
// take more, and let memory follow the bytes that arrive, not the sizes a
// file claims.
type Loader interface {
	Load(ctx context.Context, url string) (train, test *Set, err error)
}

// LoaderFunc is a Loader written as a function.
type LoaderFunc func(ctx context.Context, url string) (train, test *Set, err error)

// Load calls f.
func (f LoaderFunc) Load(ctx context.Context, url string) (*Set, *Set, error) { return f(ctx, url) }

// Registry holds data set formats by name (Register, Lookup, Names).
type Registry struct{ registry.Set[Loader] }

// NewRegistry is an empty registry.
func NewRegistry() *Registry { return &Registry{registry.Set[Loader]{Kind: "data set format"}} }

// DefaultRegistry is where Register puts formats and where workers look them
// up unless given a registry of their own.
var DefaultRegistry = NewRegistry()

// Register adds a format to DefaultRegistry, usually from an init function:
//
//	func init() { dataset.Register("csv", dataset.LoaderFunc(loadCSV)) }
func Register(format string, l Loader) { DefaultRegistry.Register(format, l) }

// FormatIDX is MNIST-style IDX files, gzip-compressed, with Fashion-MNIST's
// names (train-images-idx3-ubyte.gz, ...): the default format.
const FormatIDX = "idx"

func init() { Register(FormatIDX, LoaderFunc(LoadIDX)) }

// LoadIDX reads both splits of an IDX data set.
// Under a memory limit (WithMemoryLimit) both splits count against it.
func LoadIDX(ctx context.Context, url string) (train, test *Set, err error) {
	if train, err = Load(ctx, url, Train); err != nil {
		return nil, nil, err
	}
	if limit := MemoryLimit(ctx); limit > 0 {
		ctx = WithMemoryLimit(ctx, max(1, limit-train.Bytes()))
	}
	if test, err = Load(ctx, url, Test); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}
