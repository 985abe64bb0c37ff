// Package storeproc owns the life of a storage server the tests start as a
// process of their own (MinIO, fake-gcs-server, Azurite): started on a free
// loopback port with its output in a log file, waited for until it answers,
// and killed at the end. A server that exits or never answers is an error
// that carries its log. It also says whether a test must have its store
// (Required) and fills a bucket with a directory's files (UploadDir).
package storeproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/internal/blobopen"
	"github.com/durabletrain/durabletrain/internal/netport"
)

// Proc is a running server.
type Proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  string
}

// FreePort is a loopback port for a server, outside the ephemeral range (see netport.Free).
func FreePort() (int, error) {
	if port := netport.Free("127.0.0.1"); port != 0 {
		return port, nil
	}
	return 0, errors.New("no free loopback port")
}

// Start runs cmd (its environment already set) with its output in logPath,
// and waits up to 60 s for ready (an HTTP URL) to answer with a status below
// 500 (okStatus, if not nil, decides instead).
func Start(name string, cmd *exec.Cmd, logPath, ready string, okStatus func(int) bool) (*Proc, error) {
	if okStatus == nil {
		okStatus = func(code int) bool { return code < 500 }
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &Proc{name: name, cmd: cmd, done: make(chan error, 1), log: logPath}
	if cmd.SysProcAttr == nil {
		// A group of its own: Stop kills what the server started too
		// (mlflow server runs uvicorn as a child).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s %s: %w", name, cmd.Path, err)
	}
	go func() { p.done <- cmd.Wait(); logFile.Close() }()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get(ready)
		if err == nil {
			resp.Body.Close()
			if okStatus(resp.StatusCode) {
				return p, nil
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			return nil, fmt.Errorf("%s exited (%v):\n%s", name, err, p.Log())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s did not answer %s within 60 s:\n%s", name, ready, p.Log())
		}
	}
}

// Log is what the server has written so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// Stop kills the server, and its process group's other processes, and waits for it.
func (p *Proc) Stop() {
	if p.cmd.Process != nil {
		if a := p.cmd.SysProcAttr; a != nil && a.Setpgid {
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		}
		p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
	}
}

// Binary is a server's program: $env if set, else path, which must exist
// (what says "no NAME at path (how, or set env)" otherwise).
func Binary(name, env, path, how string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("no %s at %s (%s; or set %s)", name, path, how, env)
	}
	return path, nil
}

// Required says whether a store whose program is missing fails a test
// rather than skipping it: DURABLETRAIN_REQUIRE_SERVICES (or the older
// DURABLETRAIN_REQUIRE_S3) is set, as `make test` sets it.
func Required() bool {
	return os.Getenv("DURABLETRAIN_REQUIRE_SERVICES") != "" || os.Getenv("DURABLETRAIN_REQUIRE_S3") != ""
}

// Missing fails t with err (the store's program is missing) where stores are
// Required, and skips it otherwise.
func Missing(t testing.TB, err error) {
	t.Helper()
	if Required() {
		t.Fatal(err)
	}
	t.Skipf("%v: skipping", err)
}

// UploadDir copies the files of dir into the bucket at bucketURL (its
// ?prefix= included): a data set for a run to read from a store.
func UploadDir(t testing.TB, bucketURL, dir string) {
	t.Helper()
	ctx := context.Background()
	b, err := blobopen.Open(ctx, bucketURL)
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
			t.Fatalf("uploading %s: %v", f.Name(), err)
		}
	}
}
