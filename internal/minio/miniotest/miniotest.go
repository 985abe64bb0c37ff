// Package miniotest owns how a test gets a real MinIO: started for the test
// with one bucket, this process's AWS SDK pointed at it, and stopped at the
// test's end. Without a MinIO binary the test is skipped, unless
// DURABLETRAIN_REQUIRE_S3 is set (make test sets it: there, a missing
// binary is a failure, not a silent skip).
package miniotest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/durabletrain/durabletrain/internal/minio"
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
