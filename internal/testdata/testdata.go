// Package testdata locates the small real data committed under the
// repository's testdata/ folder, for the tests of every package.
package testdata

import (
	"path/filepath"
	"runtime"
)

// FashionMNISTSmall is the file:// URL of the committed Fashion-MNIST subset:
// the first 10000 training and 1000 test examples of the real data set.
func FashionMNISTSmall() string {
	_, here, _, _ := runtime.Caller(0)
	return "file://" + filepath.Join(filepath.Dir(here), "..", "..", "testdata", "fashion-mnist-small")
}
