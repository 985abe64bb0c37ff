// Package blobopen owns how durabletrain opens a bucket from its URL: through
// the gocloud.dev/blob drivers registered on gocloud's default URL mux, except
// where a driver package of ours takes a scheme's URLs first (package
// blobdrivers/gcs, for gs:// URLs that name their own ?endpoint=, which
// gocloud's gcsblob reads only from the process-wide STORAGE_EMULATOR_HOST).
// Every bucket the checkpoint store, the data sets and the watched buckets
// open comes through Open, so that a worker's storage root means the same
// to all of them.
package blobopen

import (
	"context"
	"net/url"
	"sync"

	"gocloud.dev/blob"
)

// Opener opens the bucket of a URL it takes, or says it does not take it
// (taken false), leaving it to gocloud's driver for the scheme.
type Opener func(ctx context.Context, u *url.URL) (b *blob.Bucket, taken bool, err error)

var (
	mu      sync.RWMutex
	openers = map[string]Opener{}
)

// Register makes open the first to see every URL of scheme (a driver
// package's init calls it). A second opener for a scheme replaces the first.
func Register(scheme string, open Opener) {
	mu.Lock()
	defer mu.Unlock()
	openers[scheme] = open
}

// Open opens the bucket at raw: the opener registered for its scheme if it
// takes the URL, else blob.OpenBucket.
func Open(ctx context.Context, raw string) (*blob.Bucket, error) {
	u, err := url.Parse(raw)
	if err == nil {
		mu.RLock()
		open := openers[u.Scheme]
		mu.RUnlock()
		if open != nil {
			if b, taken, err := open(ctx, u); taken {
				return b, err
			}
		}
	}
	return blob.OpenBucket(ctx, raw)
}
