// Package azurite starts a real Azurite (the Azure Storage emulator, a
// Node.js program installed from the npm registry into bin/azurite by `make
// azurite`, at the versions package-lock.json beside this file pins) for the
// tests and benchmarks that claim azblob://: its blob service as a process of
// its own on a free loopback port, with its data in a directory, reached
// through gocloud's azureblob like any Azure Blob Storage account, with the
// emulator's well-known account and key.
package azurite

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/durabletrain/durabletrain/internal/blobopen"
	"github.com/durabletrain/durabletrain/testkit/storeproc"

	_ "gocloud.dev/blob/azureblob"
)

// The emulator's one account, and its key: Azurite's documented defaults,
// public by design (they reach nothing but the emulator).
const (
	Account = "devstoreaccount1"
	Key     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Binary is Azurite's blob service to run: $AZURITE_BIN, else
// bin/azurite/node_modules/.bin/azurite-blob under the repository root given.
func Binary(repoRoot string) (string, error) {
	p, err := storeproc.Binary("Azurite", "AZURITE_BIN", filepath.Join(repoRoot, "bin", "azurite", "node_modules", ".bin", "azurite-blob"),
		"make azurite installs it from the npm registry")
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", errors.New("no node on PATH: Azurite is a Node.js program (install Node.js 20 or later)")
	}
	return p, nil
}

// Server is a running Azurite blob service.
type Server struct {
	Host string // 127.0.0.1:port
	proc *storeproc.Proc
}

// Start runs bin with its data in dir and waits until it answers. Azurite
// is told to accept any API version (the Go SDK may be newer than it) and
// to skip the checks of headers it does not know (--loose).
func Start(bin, dir string) (*Server, error) {
	port, err := storeproc.FreePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Host: "127.0.0.1:" + strconv.Itoa(port)}
	cmd := exec.Command(bin, "--blobHost", "127.0.0.1", "--blobPort", strconv.Itoa(port), "--location", dir,
		"--skipApiVersionCheck", "--loose", "--silent")
	cmd.Env = os.Environ()
	// Any answer is an answer: the account's root refuses an unsigned request with 403.
	s.proc, err = storeproc.Start("Azurite", cmd, filepath.Join(filepath.Dir(dir), "azurite.log"),
		"http://"+s.Host+"/"+Account+"?comp=list", nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Scheme is the URL scheme of the server's containers.
func (s *Server) Scheme() string { return "azblob" }

// Env is what a process needs to reach the server with the Azure SDK: the
// account and its shared key.
func (s *Server) Env() []string {
	return []string{"AZURE_STORAGE_ACCOUNT=" + Account, "AZURE_STORAGE_KEY=" + Key}
}

// BucketURL is the azblob:// URL of container on this server (with prefix,
// if any): the emulator's address in its query, as a worker's
// -storage-roots would give it.
func (s *Server) BucketURL(container, prefix string) string {
	q := url.Values{"domain": {s.Host}, "protocol": {"http"}, "localemu": {"true"}, "storage_account": {Account}}
	if prefix != "" {
		q.Set("prefix", prefix)
	}
	return "azblob://" + container + "?" + q.Encode()
}

// CreateBucket creates a container (the SDK's container Create, through the
// azureblob driver's client). The variables of Env must be set here.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	b, err := blobopen.Open(ctx, s.BucketURL(name, ""))
	if err != nil {
		return err
	}
	defer b.Close()
	var client *container.Client
	if !b.As(&client) {
		return errors.New("the azureblob bucket does not expose its *container.Client")
	}
	_, err = client.Create(ctx, nil)
	return err
}

// Stop kills the server.
func (s *Server) Stop() { s.proc.Stop() }
