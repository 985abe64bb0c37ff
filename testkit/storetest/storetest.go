// Package storetest owns how a test gets a real object store of each kind
// the product claims: MinIO for s3://, fake-gcs-server for gs://, Azurite
// for azblob://, each started for the test with one bucket, this process's
// SDK environment pointed at it, and stopped at the test's end; with files
// uploaded. Without a store's program the test is skipped, unless
// DURABLETRAIN_REQUIRE_SERVICES is set (storeproc.Required): `make test` sets
// it, and there a missing program is a failure, not a silent skip.
package storetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/azurite"
	"github.com/durabletrain/durabletrain/testkit/fakegcs"
	"github.com/durabletrain/durabletrain/testkit/minio/miniotest"
	"github.com/durabletrain/durabletrain/testkit/storeproc"

	_ "github.com/durabletrain/durabletrain/blobdrivers/gcs" // gs:// with ?endpoint=
)

// Server is a running store.
type Server interface {
	// Scheme is its URLs' scheme: s3, gs or azblob.
	Scheme() string
	// BucketURL is the URL of bucket (with prefix, if any), the endpoint in
	// its query, as a worker's -storage-roots gives it.
	BucketURL(bucket, prefix string) string
	// Env is what a process needs to reach it with its SDK (credentials).
	Env() []string
	// CreateBucket creates a bucket (the variables of Env set here).
	CreateBucket(ctx context.Context, name string) error
	// Stop kills it.
	Stop()
}

// Schemes are the stores' schemes, in the order the tests run them.
var Schemes = []string{"s3", "gs", "azblob"}

// Start runs the store for scheme (its program under repoRoot's bin/), with
// bucket created and this process's environment (t.Setenv) pointed at it.
func Start(t *testing.T, repoRoot, scheme, bucket string) Server {
	t.Helper()
	var (
		bin   string
		start func(bin, dir string) (Server, error)
		err   error
	)
	switch scheme {
	case "s3":
		return miniotest.Start(t, repoRoot, bucket)
	case "gs":
		bin, err = fakegcs.Binary(repoRoot)
		start = func(bin, dir string) (Server, error) { return fakegcs.Start(bin, dir) }
	case "azblob":
		bin, err = azurite.Binary(repoRoot)
		start = func(bin, dir string) (Server, error) { return azurite.Start(bin, dir) }
	default:
		t.Fatalf("storetest: no store for scheme %q; want one of %v", scheme, Schemes)
	}
	if err != nil {
		storeproc.Missing(t, err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := start(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	SetEnv(s, t.Setenv)
	if err := s.CreateBucket(context.Background(), bucket); err != nil {
		t.Fatalf("%s: creating bucket %s: %v", scheme, bucket, err)
	}
	return s
}

// SetEnv sets s's Env with set (t.Setenv, or os.Setenv).
func SetEnv(s Server, set func(k, v string)) {
	for _, kv := range s.Env() {
		for i := range kv {
			if kv[i] == '=' {
				set(kv[:i], kv[i+1:])
				break
			}
		}
	}
}
