// Package miniotest owns how a test gets a real MinIO: started for the test
// with one bucket, this process's AWS SDK pointed at it, and stopped at the
// test's end; behind a fault proxy if the test asks. (Package storetest
// starts every kind of store; this one keeps a test of s3:// alone from
// building the Google Cloud and Azure SDKs.)
package miniotest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/faultproxy"
	"github.com/durabletrain/durabletrain/testkit/minio"
	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// Start runs MinIO (minio.Binary under repoRoot) with bucket created.
// Without the binary the test is skipped, or fails where stores are
// required (storeproc.Required).
func Start(t *testing.T, repoRoot, bucket string) *minio.Server {
	t.Helper()
	bin, err := minio.Binary(repoRoot)
	if err != nil {
		storeproc.Missing(t, err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := minio.Start(bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.SetEnv(t.Setenv)
	if err := s.CreateBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	return s
}

// StartBehindFaults runs MinIO as Start does, with a fault proxy in front
// of it, and returns the proxy and the server as reached through it (its
// BucketURL goes through the proxy).
func StartBehindFaults(t *testing.T, repoRoot, bucket string) (*faultproxy.Proxy, *minio.Server) {
	t.Helper()
	srv := Start(t, repoRoot, bucket)
	p, err := faultproxy.Start(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	via := *srv
	via.Endpoint = p.URL
	return p, &via
}
