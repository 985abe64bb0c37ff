package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
)

// Build compiles the dev server and the worker (with the given build tags)
// into bin, for Config.Bin.
func Build(bin, tags string, log io.Writer) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	for _, b := range [][]string{{"devserver", ""}, {"worker", tags}} {
		fmt.Fprintf(log, "chaos: building %s\n", b[0])
		cmd := exec.Command("go", "build", "-tags", b[1], "-o", filepath.Join(bin, b[0]), "./cmd/"+b[0])
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", b[0], err, out)
		}
	}
	return nil
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", fmt.Errorf("chaos: run from within the durabletrain module (go env GOMOD: %v)", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func (h *Harness) serverAddr() string { return h.net.serverIP() + ":7233" }

func (h *Harness) startProcesses() error {
	logs := filepath.Join(h.cfg.Dir, "logs")
	h.server = &proc{name: "devserver", bin: filepath.Join(h.cfg.Bin, "devserver"), delay: 0,
		args:    []string{"-ip", h.net.serverIP(), "-insecure-public", "-port", "7233", "-ui-port", "0", "-db", filepath.Join(h.cfg.Dir, "temporal.db")},
		logPath: filepath.Join(logs, "devserver.log")}
	if err := h.server.start(); err != nil {
		return err
	}
	for i := range h.cfg.Hosts {
		p := &proc{name: fmt.Sprintf("host-%d", i), netns: h.net.ns(i), bin: filepath.Join(h.cfg.Bin, "worker"), delay: time.Second,
			args: []string{"-address", h.serverAddr(), "-role", "both", "-slots", "1", "-identity", fmt.Sprintf("host-%d", i),
				"-control-queue", "chaos", "-task-queue", "chaos-gpu", "-collective-bind", h.net.ip(i) + ":7070",
				"-collective-transport", "tcp", "-grace", "5s",
				// Storage: the harness's checkpoints, and the data set wherever it is.
				"-storage-roots", bloburl.FromPath(h.ckptDir) + "/," + dataRoot(h.cfg.Dataset) + ",mem://"},
			logPath: filepath.Join(logs, fmt.Sprintf("host-%d.log", i))}
		if h.cfg.StickyTimeout > 0 {
			p.args = append(p.args, "-sticky-timeout", h.cfg.StickyTimeout.String())
		}
		if err := p.start(); err != nil {
			return err
		}
		h.hosts = append(h.hosts, p)
	}
	return nil
}

func (h *Harness) stopProcesses() {
	for _, p := range h.hosts {
		p.stop()
	}
	if h.server != nil {
		h.server.stop()
	}
}

func (h *Harness) dial(ctx context.Context) (client.Client, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := connect.Options{Address: h.serverAddr(), Namespace: "default"}.Dial(zap.NewNop())
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("the dev server never answered at %s: %w", h.serverAddr(), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// dataRoot is a storage root that holds a data set's URL: its directory.
func dataRoot(url string) string {
	if i := strings.LastIndex(strings.SplitN(url, "?", 2)[0], "/"); i > len("file://") {
		return url[:i+1]
	}
	return url
}
