// Package miniotest owns how a test gets a real MinIO: started for the test
// with one bucket, this process's AWS SDK pointed at it, and stopped at the
// test's end; behind a fault proxy if the test asks; with files uploaded. Without a MinIO binary the test is skipped, unless
// DURABLETRAIN_REQUIRE_S3 is set (make test sets it: there, a missing
// binary is a failure, not a silent skip).
package miniotest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"gocloud.dev/blob"

	"github.com/durabletrain/durabletrain/testkit/faultproxy"
	"github.com/durabletrain/durabletrain/testkit/minio"
)

// Start runs MinIO (minio.Binary under repoRoot) with bucket created.
func Start(t *testing.T, repoRoot, bucket string) *minio.Server {
	t.Helper()
	bin, err := minio.Binary(repoRoot)
	if err != nil {
		if os.Getenv("DURABLETRAIN_REQUIRE_S3") != "" {
			t.Fatal(err)
		}
		t.Skipf("%v: skipping", err)
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

// UploadDir copies the files of dir into bucket under prefix (directly,
// past any proxy): a data set for a run to read from S3.
func UploadDir(t *testing.T, s *minio.Server, bucket, prefix, dir string) {
	t.Helper()
	ctx := context.Background()
	b, err := blob.OpenBucket(ctx, s.BucketURL(bucket, prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WriteAll(ctx, f.Name(), data, nil); err != nil {
			t.Fatal(err)
		}
	}
}
