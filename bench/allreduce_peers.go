package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// parseTransports reads a -transports flag: tcp, shm, or both.
func parseTransports(flag string) (tcp, shm bool, err error) {
	for _, t := range strings.Split(flag, ",") {
		switch t {
		case "tcp":
			tcp = true
		case "shm":
			shm = true
		default:
			return false, false, fmt.Errorf("-transports: %q; want tcp, shm or both (tcp,shm)", t)
		}
	}
	return tcp, shm, nil
}

// parseLoads reads a -load flag: idle, loaded, or both (idle,loaded).
func parseLoads(flag string) ([]string, error) {
	loads := strings.Split(flag, ",")
	for _, l := range loads {
		if l != "idle" && l != "loaded" {
			return nil, fmt.Errorf("-load: %q; want idle, loaded or both (idle,loaded)", l)
		}
	}
	return loads, nil
}

// startLoad, when on, starts one CPU-bound process per core (this binary's
// `spin`) and returns what stops them.
func startLoad(on bool) (stop func()) {
	if !on {
		return func() {}
	}
	self, err := os.Executable()
	if err != nil {
		return func() {}
	}
	var cmds []*exec.Cmd
	for range runtime.NumCPU() {
		cmd := exec.Command(self, "spin")
		if cmd.Start() == nil {
			cmds = append(cmds, cmd)
		}
	}
	time.Sleep(100 * time.Millisecond) // running before the ranks start
	return func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
}

// spin is the load of `bench allreduce -load loaded`: one core, busy, until killed.
func spin([]string) error {
	runtime.GOMAXPROCS(1)
	x := uint64(1)
	for {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if x == 0 {
			return nil
		}
	}
}

// medians is, per size, the median of the runs' times.
func medians(runs []map[int]float64) map[int]float64 {
	out := map[int]float64{}
	if len(runs) == 0 {
		return out
	}
	for size := range runs[0] {
		var ts []float64
		for _, r := range runs {
			ts = append(ts, r[size])
		}
		slices.Sort(ts)
		out[size] = ts[len(ts)/2]
	}
	return out
}

func runGlooAllReduce(ctx context.Context, dir string, world int, sizes []int) (map[int]float64, error) {
	port, err := masterPort()
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, world)
	for r := range world {
		cmds[r] = exec.CommandContext(ctx, "/usr/bin/python3", append([]string{filepath.Join(dir, "gloo_allreduce.py")}, sizeSpecs(sizes)...)...)
		cmds[r].Env = append(torchEnv(1), fmt.Sprint("RANK=", r), fmt.Sprint("WORLD_SIZE=", world), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
	}
	lines, err := runRanks(ctx, cmds, nil)
	return perOp(lines), err
}

func torchVersion() string {
	out, err := exec.Command("/usr/bin/python3", "-c", "import torch; print(torch.__version__)").Output()
	if err != nil {
		return "(not installed)"
	}
	return strings.TrimSpace(string(out))
}
