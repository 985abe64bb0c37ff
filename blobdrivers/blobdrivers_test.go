package blobdrivers_test

import (
	"testing"

	"gocloud.dev/blob"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
	"github.com/durabletrain/durabletrain/spec"
)

// Every scheme a spec may name has a driver in the binaries, so a URL that
// passes validation never fails later for want of one.
func TestEverySchemeASpecAcceptsHasADriver(t *testing.T) {
	for _, scheme := range spec.BlobSchemes() {
		if !blob.DefaultURLMux().ValidBucketScheme(scheme) {
			t.Errorf("spec accepts %s:// but no driver is registered for it", scheme)
		}
	}
}
