// Package minio starts a real MinIO server (the S3-compatible object store,
// built from the Go module proxy into bin/minio by `make minio`, at the
// version the Makefile pins) for the
// tests and benchmarks that claim S3: a process of its own on a free port,
// with its data in a directory, reached through gocloud's s3blob like any S3.
package minio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/durabletrain/durabletrain/testkit/storeproc"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/s3blob"
)

// Binary is the MinIO server to run: $MINIO_BIN, else bin/minio under the
// repository root given.
func Binary(repoRoot string) (string, error) {
	return storeproc.Binary("MinIO server", "MINIO_BIN", filepath.Join(repoRoot, "bin", "minio"), "make minio builds it from the Go module proxy")
}

// Server is a running MinIO.
type Server struct {
	Endpoint             string // http://127.0.0.1:port
	AccessKey, SecretKey string
	proc                 *storeproc.Proc
}

// Start runs bin with its data in dir and waits until it answers.
func Start(bin, dir string) (*Server, error) {
	port, err := storeproc.FreePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), AccessKey: "durabletrain", SecretKey: randomHex(20)}
	cmd := exec.Command(bin, "server", dir, "--address", "127.0.0.1:"+strconv.Itoa(port), "--console-address", "127.0.0.1:0", "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.AccessKey, "MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	s.proc, err = storeproc.Start("MinIO", cmd, filepath.Join(filepath.Dir(dir), "minio.log"), s.Endpoint+"/minio/health/ready",
		func(code int) bool { return code == http.StatusOK })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Scheme is the URL scheme of the server's buckets.
func (s *Server) Scheme() string { return "s3" }

// Env is what a process needs to reach the server with the AWS SDK.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey, "AWS_REGION=us-east-1",
		"AWS_EC2_METADATA_DISABLED=true"}
}

// SetEnv sets Env in this process (tests: for t.Setenv, call it per variable).
func (s *Server) SetEnv(set func(k, v string)) {
	for _, kv := range s.Env() {
		for i := range kv {
			if kv[i] == '=' {
				set(kv[:i], kv[i+1:])
				break
			}
		}
	}
}

// BucketURL is the s3:// URL of bucket on this server (with prefix, if any):
// the endpoint and path-style addressing in its query, as a worker's
// -storage-roots would give them.
func (s *Server) BucketURL(bucket, prefix string) string {
	q := url.Values{"endpoint": {s.Endpoint}, "use_path_style": {"true"}, "disable_https": {"true"}, "region": {"us-east-1"}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return "s3://" + bucket + "?" + q.Encode()
}

// CreateBucket creates a bucket (the AWS SDK's CreateBucket, through the
// s3blob driver's client). The AWS variables of Env must be set here.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	b, err := blob.OpenBucket(ctx, s.BucketURL(name, ""))
	if err != nil {
		return err
	}
	defer b.Close()
	var client *s3.Client
	if !b.As(&client) {
		return errors.New("the s3blob bucket does not expose its *s3.Client")
	}
	_, err = client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name})
	return err
}

// Stop kills the server.
func (s *Server) Stop() { s.proc.Stop() }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
