package main

import (
	"bufio"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/durabletrain/durabletrain/internal/netport"
)

//go:embed peers
var peerFiles embed.FS

// peerDir writes the embedded peer programs to a temporary folder.
func peerDir() (string, error) {
	dir, err := os.MkdirTemp("", "durabletrain-bench-")
	if err != nil {
		return "", err
	}
	entries, _ := peerFiles.ReadDir("peers")
	for _, e := range entries {
		data, _ := peerFiles.ReadFile("peers/" + e.Name())
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// freeAddrs picks n loopback addresses for rank listeners, distinct and
// outside the ephemeral range (see netport.Free).
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, 0, n)
	seen := map[int]bool{}
	for len(addrs) < n {
		port := netport.Free("127.0.0.1")
		if port == 0 {
			return nil, errors.New("no free loopback port for a rank")
		}
		if !seen[port] {
			seen[port] = true
			addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		}
	}
	return addrs, nil
}

// selfRanks makes one command per rank that runs this binary again, with the
// arguments args gives for that rank and the comma-separated rank addresses.
func selfRanks(ctx context.Context, world int, args func(rank int, peers string) []string) ([]*exec.Cmd, error) {
	addrs, err := freeAddrs(world)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, world)
	for r := range world {
		cmds[r] = exec.CommandContext(ctx, self, args(r, strings.Join(addrs, ","))...)
	}
	return cmds, nil
}

// masterPort is a free port for torch.distributed's rendezvous, drawn as the
// exec trainer draws it: outside the ephemeral range.
func masterPort() (string, error) {
	port := netport.Free("127.0.0.1")
	if port == 0 {
		return "", errors.New("no free port for MASTER_PORT")
	}
	return strconv.Itoa(port), nil
}

// runRanks starts one command per rank and collects the JSON lines they print;
// lines that are not JSON objects go to onText (progress), if given.
func runRanks(ctx context.Context, cmds []*exec.Cmd, onText func(rank int, line string)) ([]map[string]any, error) {
	var mu sync.Mutex
	var out []map[string]any
	var wg sync.WaitGroup
	errs := make([]error, len(cmds))
	for r, cmd := range cmds {
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
		}
		wg.Go(func() {
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				var m map[string]any
				if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &m) == nil {
					mu.Lock()
					out = append(out, m)
					mu.Unlock()
				} else if onText != nil {
					onText(r, line)
				}
			}
			io.Copy(io.Discard, stdout)
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d (%s): %v\n%s", r, filepath.Base(cmd.Path), err, tail(stderr.String(), 2000))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	return out, ctx.Err()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// torchEnv is the environment of a fair PyTorch peer: OpenBLAS rather than the
// reference BLAS, and `threads` threads per process.
func torchEnv(threads int) []string {
	env := os.Environ()
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/openblas-openmp"); err == nil {
		env = append(env, "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp")
	}
	t := fmt.Sprint(threads)
	return append(env, "OMP_NUM_THREADS="+t, "OPENBLAS_NUM_THREADS="+t, "MKL_NUM_THREADS="+t)
}

func num(m map[string]any, k string) float64 {
	v, _ := m[k].(float64)
	return v
}
