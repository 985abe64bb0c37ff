// Package fakegcs starts a real fake-gcs-server (the Google Cloud Storage
// emulator, built from the Go module proxy into bin/fake-gcs-server by `make
// fake-gcs-server`, at the version the Makefile pins) for the tests and
// benchmarks that claim gs://: a process of its own on a free loopback port,
// with its objects in a directory, reached through gocloud's gcsblob (with
// the endpoint in the URL, package blobdrivers/gcs) like any GCS.
package fakegcs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// Binary is the server to run: $FAKE_GCS_BIN, else bin/fake-gcs-server
// under the repository root given.
func Binary(repoRoot string) (string, error) {
	return storeproc.Binary("fake-gcs-server", "FAKE_GCS_BIN", filepath.Join(repoRoot, "bin", "fake-gcs-server"), "make fake-gcs-server builds it from the Go module proxy")
}

// Server is a running fake-gcs-server.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	proc     *storeproc.Proc
}

// Start runs bin with its objects under dir and waits until it answers.
func Start(bin, dir string) (*Server, error) {
	port, err := storeproc.FreePort()
	if err != nil {
		return nil, err
	}
	host := "127.0.0.1:" + strconv.Itoa(port)
	s := &Server{Endpoint: "http://" + host}
	cmd := exec.Command(bin, "-scheme", "http", "-host", "127.0.0.1", "-port", strconv.Itoa(port),
		"-public-host", host, "-external-url", s.Endpoint,
		"-backend", "memory", "-log-level", "warn")
	cmd.Env = os.Environ()
	s.proc, err = storeproc.Start("fake-gcs-server", cmd, filepath.Join(filepath.Dir(dir), "fake-gcs-server.log"),
		s.Endpoint+"/storage/v1/b", func(code int) bool { return code == http.StatusOK })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Scheme is the URL scheme of the server's buckets.
func (s *Server) Scheme() string { return "gs" }

// Env is what a process needs to reach the server: nothing (it takes no
// credentials; the URL says so with ?anonymous=true).
func (s *Server) Env() []string { return nil }

// BucketURL is the gs:// URL of bucket on this server (with prefix, if
// any): the endpoint in its query, as a worker's -storage-roots would give it.
func (s *Server) BucketURL(bucket, prefix string) string {
	q := url.Values{"endpoint": {s.Endpoint}, "anonymous": {"true"}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return "gs://" + bucket + "?" + q.Encode()
}

// CreateBucket creates a bucket (the JSON API's buckets.insert).
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	body, _ := json.Marshal(map[string]string{"name": name})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Endpoint+"/storage/v1/b?project=durabletrain", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("fake-gcs-server: creating bucket %s: %s: %s", name, resp.Status, msg)
	}
	return nil
}

// Stop kills the server.
func (s *Server) Stop() { s.proc.Stop() }
