// Package mlflowserver starts a real MLflow tracking server (`mlflow
// server` from the project's virtual environment, at the version
// python/requirements-test.txt pins) for the tests that claim MLflow: a
// process of its own on a free loopback port, its runs in SQLite under a
// directory of the test's, stopped at the test's end. It can also be
// started late on a port chosen before (StartAt): a server that comes up
// while a run is logging to it.
package mlflowserver

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// Binary is the program: $MLFLOW_BIN, else .venv/bin/mlflow under the
// repository root given.
func Binary(repoRoot string) (string, error) {
	return storeproc.Binary("mlflow", "MLFLOW_BIN", filepath.Join(repoRoot, ".venv", "bin", "mlflow"), "make venv installs it")
}

// Server is a running tracking server.
type Server struct {
	URL  string // http://127.0.0.1:port
	Dir  string // its SQLite database and artifacts
	proc *storeproc.Proc
}

// Port is a free loopback port for StartAt.
func Port(t testing.TB) int {
	t.Helper()
	port, err := storeproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Start runs a server on a free port for t, or fails or skips t where the
// program is missing (storeproc.Missing).
func Start(t testing.TB, repoRoot string) *Server {
	t.Helper()
	return StartAt(t, repoRoot, Port(t), t.TempDir())
}

// StartAt runs a server on port with its runs under dir (a server started
// again on the same dir has the runs of the one before).
func StartAt(t testing.TB, repoRoot string, port int, dir string) *Server {
	t.Helper()
	bin, err := Binary(repoRoot)
	if err != nil {
		storeproc.Missing(t, err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port), Dir: dir}
	cmd := exec.Command(bin, "server", "--backend-store-uri", "sqlite:///"+filepath.Join(dir, "mlflow.db"),
		"--default-artifact-root", filepath.Join(dir, "artifacts"), "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--workers", "1")
	// Its own store, whatever the caller's; no job runner (a process this
	// server would start for jobs no test makes).
	cmd.Env = append(os.Environ(), "MLFLOW_TRACKING_URI=", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false")
	cmd.Dir = dir
	s.proc, err = storeproc.Start("mlflow server", cmd, filepath.Join(dir, fmt.Sprintf("mlflow-%d.log", port)), s.URL+"/health",
		func(code int) bool { return code == http.StatusOK })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the server (again is harmless).
func (s *Server) Stop() { s.proc.Stop() }

// Log is what the server has written.
func (s *Server) Log() string { return s.proc.Log() }
