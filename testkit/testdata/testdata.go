// Package testdata locates the small real data committed under the
// repository's testdata/ folder, for the tests of every package.
package testdata

import (
	"path/filepath"
	"runtime"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// FashionMNISTSmallDir is the folder of the committed Fashion-MNIST subset:
// the first 10000 training and 1000 test examples of the real data set.
func FashionMNISTSmallDir() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "testdata", "fashion-mnist-small")
}

// FashionMNISTSmall is the file:// URL of FashionMNISTSmallDir, escaped, so
// that a clone in a folder whose name has a space or a '#' works.
func FashionMNISTSmall() string { return bloburl.FromPath(FashionMNISTSmallDir()) }
