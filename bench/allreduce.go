package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// fixedIterations, where positive, is every run's operations, whatever the
// size (bench allreduce -iters).
var fixedIterations int

// iterations gives every size about the same bytes moved, within bounds,
// unless -iters fixed them.
func iterations(size int) int {
	if fixedIterations > 0 {
		return fixedIterations
	}
	return min(2000, max(5, (512<<20)/size))
}

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
	loadFlag := fs.String("load", "idle,loaded", "idle, loaded (a CPU-bound process on every core beside every implementation) or both")
	perHost := fs.Int("per-host", 1, "ranks per simulated host (one process each): compares our flat ring and hierarchical all-reduce")
	gather := fs.Int("gather", 0, "also measure ours with Options.GatherBytes set to this (the small all-reduce: gather in world-1 steps, sum in the ring's order), interleaved with the ring; 0: not measured")
	gatherLinks := fs.Bool("gather-links", true, "over TCP, the gathered column gathers over links to the ranks 2, 4, ... away (Options.GatherLinks: 3 ranks or more); false: around the ring. Shared memory rows gather around the ring")
	chunk := fs.String("chunk", "", "ours: Options.ChunkBytes, the chunk over TCP (K, M suffixes); empty: the default")
	shmChunk := fs.String("shm-chunk", "", "ours: Options.ShmChunkBytes, the chunk over shared memory; empty: the default")
	windowBytes := fs.String("window", "", "ours through host windows: Options.WindowBytes, each half of a rank's window; empty: the default")
	shmRing := fs.String("shm-ring", "", "ours: Options.ShmRingBytes, what a shared-memory ring holds; empty: the default")
	windows := fs.Bool("windows", true, "also measure ours through host windows on shared memory (Options.HostWindows), interleaved with the ring")
	spinWindow := fs.Duration("spin", 0, "ours: Options.SpinWindow, how long a small operation polls before it sleeps (negative: never); 0: the default")
	iters := fs.Int("iters", 0, "operations per run, every size and implementation alike; 0: about 512 MiB a size, 5 to 2,000. Under load a run shorter than a time slice (2,000 operations of 4 KiB over shared memory take a few milliseconds) measures whether it lost one: give small sizes enough to span many")
	transportsFlag := fs.String("transports", "tcp,shm", "the tables to measure: tcp, shm or both (tcp,shm)")
	fs.Parse(args)
	if *iters < 0 {
		return fmt.Errorf("-iters: %d; want a count of operations per run, or 0 for about 512 MiB a size", *iters)
	}
	fixedIterations = *iters
	wantTCP, wantShm, err := parseTransports(*transportsFlag)
	if err != nil {
		return err
	}
	var tuning []string // key=value arguments of every rank of ours
	for _, f := range []struct{ flag, key, value string }{{"-chunk", "chunk", *chunk}, {"-shm-chunk", "shmchunk", *shmChunk}, {"-shm-ring", "shmring", *shmRing}, {"-window", "window", *windowBytes}} {
		if f.value == "" {
			continue
		}
		n, err := parseSize(f.value)
		if err != nil || n < 4 {
			return fmt.Errorf("%s: %q is not a size of 4 bytes or more like 128K or 1M", f.flag, f.value)
		}
		tuning = append(tuning, f.key+"="+strconv.Itoa(n))
	}
	if *spinWindow != 0 {
		tuning = append(tuning, "spin="+spinWindow.String())
	}
	tuning = slices.Clip(tuning) // each run appends its own options
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := parseSize(s)
		if err != nil || n < 4 || n%4 != 0 {
			return fmt.Errorf("-sizes: %q is not a size like 4K or 16M (bytes of float32s: a multiple of 4)", s)
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
		if out, err := exec.Command("cc", "-O2", "-o", filepath.Join(dir, "tcp_stream"), filepath.Join(dir, "tcp_stream.c")).CombinedOutput(); err != nil {
			return fmt.Errorf("building the TCP ceiling (tcp_stream.c): %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	if *perHost > 1 {
		if *transportsFlag != "tcp,shm" {
			return fmt.Errorf("-transports %q: simulated hosts (-per-host) measure their own rows, over TCP between hosts; leave -transports out", *transportsFlag)
		}
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
	var worlds []int
	for _, rs := range strings.Split(*ranksFlag, ",") {
		world, err := strconv.Atoi(rs)
		if err != nil || world < 2 {
			return fmt.Errorf("-ranks: %q; want world sizes of 2 or more", rs)
		}
		worlds = append(worlds, world)
	}
	loads, err := parseLoads(*loadFlag)
	if err != nil {
		return err
	}
	if *iters > 0 {
		fmt.Printf("# %d operations per run at every size (-iters)\n", *iters)
	}
	fmt.Printf("# all-reduce of float32 sums, ranks as processes on one machine; time = slowest rank's mean per operation\n")
	fmt.Printf("# median of %d interleaved runs per implementation; ±: (max-min)/median over the runs\n", *repeat)
	fmt.Printf("# algbw = bytes/time, busbw = algbw*2(n-1)/n (nccl-tests); like with like: ours over TCP against gloo (torch %s)\n", torchVersion())
	fmt.Printf("# and OpenMPI over TCP (--mca btl tcp,self); ours over shared memory against OpenMPI's (--mca btl vader,self)\n")
	if *windows {
		fmt.Printf("# windows: ours over shared memory through host windows (collective.Options.HostWindows): every rank maps every\n")
		fmt.Printf("# other's window and reads their data where it lies, two barriers per piece; the ring's sums, bit for bit\n")
	}
	if *peers {
		fmt.Printf("# ring ceiling over TCP: every rank streams a ring all-reduce's 2(n-1)/n*size bytes per operation to its\n")
		fmt.Printf("# right neighbour and reads as much from its left, no sums, no framing, no waits (bench/peers/tcp_stream.c);\n")
		fmt.Printf("# a bound on bandwidth for 1 MiB and up, idle (below 1 MiB the stream overlaps operations; loaded it waits for\n")
		fmt.Printf("# no slow rank, as an all-reduce must, and bounds nothing). With 2 ranks no all-reduce\n")
		fmt.Printf("# moves fewer bytes or has another pattern, so ceiling/best peer bounds how far any can beat the best peer; with\n")
		fmt.Printf("# more ranks than cores an algorithm of fewer steps (OpenMPI's recursive halving at 4 ranks) can pass it\n")
	}
	if len(tuning) > 0 {
		fmt.Printf("# ours tuned: %s (collective.Options)\n", strings.Join(tuning, " "))
	}
	fmt.Printf("# loaded: one CPU-bound process per core (%d) runs beside every implementation alike\n", runtime.NumCPU())
	for _, load := range loads {
		var tcpRows, shmRows [][]string
		for _, world := range worlds {
			var impls []string
			if wantTCP {
				impls = append(impls, "ours-tcp")
				if *gather > 0 {
					impls = append(impls, "ours-tcp-gather")
				}
				if *peers {
					impls = append(impls, "gloo", "mpi-tcp", "tcp-ceiling")
				}
			}
			if wantShm {
				impls = append(impls, "ours-shm")
				if *gather > 0 {
					impls = append(impls, "ours-shm-gather")
				}
				if *windows {
					impls = append(impls, "ours-windows")
				}
				if *peers {
					impls = append(impls, "mpi-shm")
				}
			}
			runs := map[string][]map[int]float64{}
			for range max(1, *repeat) {
				for _, impl := range impls {
					stop := startLoad(load == "loaded")
					var r map[int]float64
					var err error
					switch impl {
					case "ours-tcp":
						r, err = runOurAllReduce(ctx, world, sizes, append(tuning, "transport="+collective.TransportTCP))
					case "ours-shm":
						r, err = runOurAllReduce(ctx, world, sizes, append(tuning, "transport="+collective.TransportAuto))
					case "ours-tcp-gather":
						r, err = runOurAllReduce(ctx, world, sizes, append(tuning, "transport="+collective.TransportTCP, "gather="+strconv.Itoa(*gather), "links="+strconv.FormatBool(*gatherLinks)))
					case "ours-windows":
						r, err = runOurAllReduce(ctx, world, sizes, append(tuning, "transport="+collective.TransportAuto, "windows=true"))
					case "ours-shm-gather":
						r, err = runOurAllReduce(ctx, world, sizes, append(tuning, "transport="+collective.TransportAuto, "gather="+strconv.Itoa(*gather))) // shared memory all round: no links
					default:
						r, err = runPeerAllReduce(ctx, impl, dir, mpiBin, world, sizes)
					}
					stop()
					if err != nil {
						return fmt.Errorf("%s, %s: %w", impl, load, err)
					}
					runs[impl] = append(runs[impl], r)
				}
			}
			med := map[string]map[int]float64{}
			for impl, rs := range runs {
				med[impl] = medians(rs)
			}
			busFactor := 2 * float64(world-1) / float64(world)
			bus := func(impl string, size int) float64 { return float64(size) / med[impl][size] * busFactor / 1e9 }
			us := func(impl string, size int) string {
				return fmt.Sprintf("%.1f ±%.0f%%", med[impl][size]*1e6, 100*spread(runs[impl], size))
			}
			tcpRow := func(size int) []string {
				tcp := []string{humanBytes(size), fmt.Sprint(world), us("ours-tcp", size), fmt.Sprintf("%.2f", bus("ours-tcp", size))}
				if *gather > 0 {
					tcp = append(tcp, us("ours-tcp-gather", size), fmt.Sprintf("%.2fx", med["ours-tcp-gather"][size]/med["ours-tcp"][size]))
				}
				if *peers {
					best := max(bus("gloo", size), bus("mpi-tcp", size))
					ceiling := bus("tcp-ceiling", size)
					tcp = append(tcp, us("gloo", size), us("mpi-tcp", size), fmt.Sprintf("%.2f", best),
						fmt.Sprintf("%.2fx", bus("ours-tcp", size)/best), fmt.Sprintf("%.2fx", med["ours-tcp"][size]/med["mpi-tcp"][size]),
						fmt.Sprintf("%.2f", ceiling), fmt.Sprintf("%.0f%%", 100*bus("ours-tcp", size)/ceiling),
						fmt.Sprintf("%.0f%%", 100*best/ceiling), fmt.Sprintf("%.2fx", ceiling/best))
				}
				return tcp
			}
			shmRow := func(size int) []string {
				shm := []string{humanBytes(size), fmt.Sprint(world), us("ours-shm", size), fmt.Sprintf("%.2f", bus("ours-shm", size))}
				if *gather > 0 {
					shm = append(shm, us("ours-shm-gather", size), fmt.Sprintf("%.2fx", med["ours-shm-gather"][size]/med["ours-shm"][size]))
				}
				if *peers {
					shm = append(shm, us("mpi-shm", size), fmt.Sprintf("%.2f", bus("mpi-shm", size)),
						fmt.Sprintf("%.2fx", bus("ours-shm", size)/bus("mpi-shm", size)), fmt.Sprintf("%.2fx", med["ours-shm"][size]/med["mpi-shm"][size]))
				}
				if *windows {
					shm = append(shm, us("ours-windows", size), fmt.Sprintf("%.2f", bus("ours-windows", size)))
					if *peers {
						shm = append(shm, fmt.Sprintf("%.2fx", bus("ours-windows", size)/bus("mpi-shm", size)), fmt.Sprintf("%.2fx", med["ours-windows"][size]/med["mpi-shm"][size]))
					}
				}
				return shm
			}
			for _, size := range sizes {
				if wantTCP {
					tcpRows = append(tcpRows, tcpRow(size))
				}
				if wantShm {
					shmRows = append(shmRows, shmRow(size))
				}
			}
		}
		gathered := []string{fmt.Sprintf("gathered (%s) µs", humanBytes(*gather)), "gathered / ring"}
		if wantTCP {
			fmt.Printf("\n## %s, TCP\n\n", load)
			header := []string{"size", "ranks", "ours µs", "ours busbw GB/s"}
			if *gather > 0 {
				header = append(header, gathered...)
			}
			if *peers {
				header = append(header, "gloo µs", "mpi µs", "best peer busbw", "busbw vs best peer", "time vs mpi",
					"ring ceiling busbw", "ours / ceiling", "best peer / ceiling", "ceiling / best peer")
			}
			table(header, tcpRows)
		}
		if !wantShm {
			continue
		}
		fmt.Printf("\n## %s, shared memory\n\n", load)
		header := []string{"size", "ranks", "ours µs", "ours busbw GB/s"}
		if *gather > 0 {
			header = append(header, gathered...)
		}
		if *peers {
			header = append(header, "mpi µs", "mpi busbw", "busbw vs mpi", "time vs mpi")
		}
		if *windows {
			header = append(header, "windows µs", "windows busbw")
			if *peers {
				header = append(header, "windows busbw vs mpi", "windows time vs mpi")
			}
		}
		table(header, shmRows)
	}
	return nil
}

func runOurAllReduce(ctx context.Context, world int, sizes []int, options []string) (map[int]float64, error) {
	cmds, err := selfRanks(ctx, world, func(rank int, peers string) []string {
		args := append([]string{"allreduce-rank", strconv.Itoa(rank), peers}, options...)
		return append(args, sizeSpecs(sizes)...)
	})
	if err != nil {
		return nil, err
	}
	lines, err := runRanks(ctx, cmds, nil)
	return perOp(lines), err
}

// allReduceRank is one rank of our all-reduce benchmark: RANK ADDRS
// [transport=T] [gather=BYTES] [links=BOOL] [windows=BOOL] [chunk=BYTES] [shmchunk=BYTES] [shmring=BYTES] [window=BYTES]
// [spin=DURATION] SIZE:ITERS...
func allReduceRank(args []string) error {
	if len(args) < 3 {
		return errors.New("usage: allreduce-rank RANK ADDR,ADDR,... [KEY=VALUE...] SIZE:ITERS... (a child process of bench allreduce)")
	}
	peers := strings.Split(args[1], ",")
	rank, err := indexArg("RANK", args[0], len(peers))
	if err != nil {
		return err
	}
	opts := collective.Options{Secret: benchSecret}
	specs := args[2:]
	for len(specs) > 0 && strings.Contains(specs[0], "=") {
		key, value, _ := strings.Cut(specs[0], "=")
		n, _ := strconv.Atoi(value)
		switch key {
		case "transport":
			opts.Transport = value
		case "gather":
			opts.GatherBytes = n
		case "links":
			opts.GatherLinks = value == "true"
		case "windows":
			opts.HostWindows = value == "true"
		case "chunk":
			opts.ChunkBytes = n
		case "shmchunk":
			opts.ShmChunkBytes = n
		case "shmring":
			opts.ShmRingBytes = n
		case "window":
			opts.WindowBytes = n
		case "spin":
			if opts.SpinWindow, err = time.ParseDuration(value); err != nil {
				return fmt.Errorf("allreduce-rank: %q: %w", specs[0], err)
			}
		default:
			return fmt.Errorf("allreduce-rank: unknown option %q", specs[0])
		}
		specs = specs[1:]
	}
	for _, spec := range specs {
		if _, _, err := sizeSpec(spec); err != nil {
			return err
		}
	}
	ln, err := collective.Listen(peers[rank], nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// A rank that never comes (its port taken between the bench choosing
	// it and the rank binding it) fails the others within a minute, not at
	// the run's ten.
	jctx, jcancel := context.WithTimeout(ctx, time.Minute)
	g, err := collective.Join(jctx, ln, collective.Gang{Run: "bench", Generation: 1, Peers: peers}, rank, opts)
	jcancel()
	if err != nil {
		return err
	}
	defer g.Close()
	for _, spec := range specs {
		size, iters, _ := sizeSpec(spec) // checked before the gang formed
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

// indexArg parses a child process's argument that indexes n things (a
// rank among its peers, a host among the hosts).
func indexArg(name, value string, n int) (int, error) {
	i, err := strconv.Atoi(value)
	if err != nil || i < 0 || i >= n {
		return 0, fmt.Errorf("%s %q; want 0..%d", name, value, n-1)
	}
	return i, nil
}

// sizeSpec parses SIZE:ITERS, a buffer of SIZE bytes (a multiple of 4)
// all-reduced ITERS times.
func sizeSpec(spec string) (size, iters int, err error) {
	a, b, ok := strings.Cut(spec, ":")
	size, err1 := strconv.Atoi(a)
	iters, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || size < 0 || size%4 != 0 || iters < 1 {
		return 0, 0, fmt.Errorf("size spec %q; want SIZE:ITERS, SIZE bytes (a multiple of 4), ITERS at least 1", spec)
	}
	return size, iters, nil
}
