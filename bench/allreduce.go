package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/collective"
)

var benchSecret = []byte("durabletrain-bench-secret")

func parseSize(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.Atoi(s)
	return n * mult, err
}

func humanBytes(n int) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

// iterations gives every size about the same bytes moved, within bounds.
func iterations(size int) int { return min(2000, max(5, (512<<20)/size)) }

// sizeSpecs are "bytes:iterations" arguments, the form every implementation takes.
func sizeSpecs(sizes []int) []string {
	var specs []string
	for _, s := range sizes {
		specs = append(specs, fmt.Sprintf("%d:%d", s, iterations(s)))
	}
	return specs
}

// perOp is the slowest rank's seconds per operation, by size.
func perOp(lines []map[string]any) map[int]float64 {
	out := map[int]float64{}
	for _, l := range lines {
		size := int(num(l, "bytes"))
		out[size] = max(out[size], num(l, "seconds")/num(l, "iters"))
	}
	return out
}

func benchAllReduce(args []string) error {
	fs := flag.NewFlagSet("allreduce", flag.ExitOnError)
	ranksFlag := fs.String("ranks", "2,4", "world sizes to measure, comma-separated")
	sizesFlag := fs.String("sizes", "4K,64K,1M,16M,64M,256M", "buffer sizes in bytes (K, M, G suffixes)")
	peers := fs.Bool("peers", true, "also measure gloo and OpenMPI")
	repeat := fs.Int("repeat", 3, "runs of each implementation, interleaved; the table shows medians")
	perHost := fs.Int("per-host", 1, "ranks per simulated host (one process each): compares our flat ring and hierarchical all-reduce")
	fs.Parse(args)
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := parseSize(s)
		if err != nil || n < 4 {
			return fmt.Errorf("-sizes: %q is not a size like 4K or 16M", s)
		}
		sizes = append(sizes, n)
	}
	dir, err := peerDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mpiBin := filepath.Join(dir, "mpi_allreduce")
	if *peers {
		if out, err := exec.Command("mpicc", "-O2", "-o", mpiBin, filepath.Join(dir, "mpi_allreduce.c")).CombinedOutput(); err != nil {
			return fmt.Errorf("building the OpenMPI peer (make deps-bench installs libopenmpi-dev): %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	if *perHost > 1 {
		var worlds []int
		for _, rs := range strings.Split(*ranksFlag, ",") {
			world, err := strconv.Atoi(rs)
			if err != nil || world < 2 {
				return fmt.Errorf("-ranks: %q; want world sizes of 2 or more", rs)
			}
			worlds = append(worlds, world)
		}
		return benchHostsAllReduce(ctx, dir, mpiBin, worlds, *perHost, sizes, *peers, *repeat)
	}
	fmt.Printf("# all-reduce of float32 sums, ranks as processes on loopback TCP; time = slowest rank's mean per operation\n")
	fmt.Printf("# median of %d interleaved runs per implementation\n", *repeat)
	fmt.Printf("# algbw = bytes/time, busbw = algbw*2(n-1)/n (nccl-tests); gloo via torch %s, OpenMPI with --mca btl tcp,self\n\n", torchVersion())
	var rows [][]string
	for _, rs := range strings.Split(*ranksFlag, ",") {
		world, err := strconv.Atoi(rs)
		if err != nil || world < 2 {
			return fmt.Errorf("-ranks: %q; want world sizes of 2 or more", rs)
		}
		var oursRuns, glooRuns, mpiRuns []map[int]float64
		for range max(1, *repeat) {
			r, err := runOurAllReduce(ctx, world, sizes)
			if err != nil {
				return fmt.Errorf("ours: %w", err)
			}
			oursRuns = append(oursRuns, r)
			if *peers {
				if r, err = runGlooAllReduce(ctx, dir, world, sizes); err != nil {
					return fmt.Errorf("gloo: %w", err)
				}
				glooRuns = append(glooRuns, r)
				if r, err = runMPIAllReduce(ctx, mpiBin, world, sizes); err != nil {
					return fmt.Errorf("openmpi: %w", err)
				}
				mpiRuns = append(mpiRuns, r)
			}
		}
		ours, gloo, mpi := medians(oursRuns), medians(glooRuns), medians(mpiRuns)
		busFactor := 2 * float64(world-1) / float64(world)
		bus := func(t float64, size int) float64 { return float64(size) / t * busFactor / 1e9 }
		for _, size := range sizes {
			row := []string{humanBytes(size), fmt.Sprint(world),
				fmt.Sprintf("%.1f", ours[size]*1e6), fmt.Sprintf("%.2f", float64(size)/ours[size]/1e9), fmt.Sprintf("%.2f", bus(ours[size], size))}
			if *peers {
				best := max(bus(gloo[size], size), bus(mpi[size], size))
				row = append(row,
					fmt.Sprintf("%.1f", gloo[size]*1e6), fmt.Sprintf("%.2f", bus(gloo[size], size)),
					fmt.Sprintf("%.1f", mpi[size]*1e6), fmt.Sprintf("%.2f", bus(mpi[size], size)),
					fmt.Sprintf("%.2fx", bus(ours[size], size)/best), fmt.Sprintf("%.2fx", ours[size]/mpi[size]), fmt.Sprintf("%.2fx", ours[size]/gloo[size]))
			}
			rows = append(rows, row)
		}
	}
	header := []string{"size", "ranks", "ours µs", "ours algbw GB/s", "ours busbw GB/s"}
	if *peers {
		header = append(header, "gloo µs", "gloo busbw", "mpi µs", "mpi busbw", "busbw vs best peer", "time vs mpi", "time vs gloo")
	}
	table(header, rows)
	return nil
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

func runOurAllReduce(ctx context.Context, world int, sizes []int) (map[int]float64, error) {
	cmds, err := selfRanks(ctx, world, func(rank int, peers string) []string {
		return append([]string{"allreduce-rank", strconv.Itoa(rank), peers}, sizeSpecs(sizes)...)
	})
	if err != nil {
		return nil, err
	}
	lines, err := runRanks(ctx, cmds, nil)
	return perOp(lines), err
}

// allReduceRank is one rank of our all-reduce benchmark: RANK ADDRS SIZE:ITERS...
func allReduceRank(args []string) error {
	rank, _ := strconv.Atoi(args[0])
	peers := strings.Split(args[1], ",")
	ln, err := collective.Listen(peers[rank], nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	g, err := collective.Join(ctx, ln, collective.Gang{Run: "bench", Generation: 1, Peers: peers}, rank, collective.Options{Secret: benchSecret})
	if err != nil {
		return err
	}
	defer g.Close()
	for _, spec := range args[2:] {
		var size, iters int
		fmt.Sscanf(spec, "%d:%d", &size, &iters)
		buf := make([]float32, size/4)
		for i := range buf {
			buf[i] = 1
		}
		for range max(2, iters/10) {
			if err := g.AllReduce(ctx, buf); err != nil {
				return err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		for range iters {
			if err := g.AllReduce(ctx, buf); err != nil {
				return err
			}
		}
		elapsed := time.Since(start).Seconds()
		line, _ := json.Marshal(map[string]any{"rank": rank, "bytes": size, "iters": iters, "seconds": elapsed})
		fmt.Println(string(line))
	}
	return g.Barrier(ctx)
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

func runMPIAllReduce(ctx context.Context, bin string, world int, sizes []int) (map[int]float64, error) {
	return runMPIAllReduceOver(ctx, bin, world, sizes, "tcp,self")
}

func torchVersion() string {
	out, err := exec.Command("/usr/bin/python3", "-c", "import torch; print(torch.__version__)").Output()
	if err != nil {
		return "(not installed)"
	}
	return strings.TrimSpace(string(out))
}
