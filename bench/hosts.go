package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/durabletrain/durabletrain/collective"
)

// benchHostsAllReduce is `bench allreduce -per-host P`: simulated hosts of P
// ranks each, one process per host (as a worker process owns a host's
// GPUs), all on this machine. Ours runs twice: one flat ring over every rank
// (neighbours on the same host pass chunks through shared memory, hosts
// through TCP) and hierarchically (a host's ranks sum in memory, one ring of
// hosts over TCP). Each simulated host listens on an address of its own
// (127.0.0.x), and our links between hosts are TCP. The peers run one process per rank: gloo over TCP, and
// OpenMPI twice, over TCP only and with its shared-memory transport (vader),
// which on one machine carries every pair, across simulated hosts too.
func benchHostsAllReduce(ctx context.Context, dir, mpiBin string, worlds []int, perHost int, sizes []int, peers bool, repeat int) error {
	fmt.Printf("# all-reduce of float32 sums over simulated hosts of %d ranks, one process per host for ours, one per rank for the peers\n", perHost)
	fmt.Printf("# time = slowest rank's mean per operation; median of %d interleaved runs; spread = (max-min)/median over the runs\n", repeat)
	fmt.Printf("# ring: ours, one ring of every rank; hier: ours, within the host in memory then a ring of hosts over TCP;\n")
	fmt.Printf("# gloo via torch %s (TCP); mpi-tcp: OpenMPI --mca btl tcp,self; mpi-shm: OpenMPI --mca btl vader,self (all on one machine)\n\n", torchVersion())
	impls := []string{"ring", "hier"}
	if peers {
		impls = append(impls, "gloo", "mpi-tcp", "mpi-shm")
	}
	var rows [][]string
	for _, world := range worlds {
		if world%perHost != 0 || world/perHost < 1 {
			return fmt.Errorf("-ranks: %d is not a whole number of hosts of %d", world, perHost)
		}
		runs := map[string][]map[int]float64{}
		for range max(1, repeat) {
			for _, impl := range impls {
				var r map[int]float64
				var err error
				switch impl {
				case "ring", "hier":
					r, err = runHostsAllReduce(ctx, impl, world/perHost, perHost, sizes)
				default:
					r, err = runPeerAllReduce(ctx, impl, dir, mpiBin, world, sizes)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", impl, err)
				}
				runs[impl] = append(runs[impl], r)
			}
		}
		med := map[string]map[int]float64{}
		for impl, rs := range runs {
			med[impl] = medians(rs)
		}
		for _, size := range sizes {
			row := []string{humanBytes(size), fmt.Sprint(world), fmt.Sprint(world / perHost)}
			for _, impl := range impls {
				row = append(row, fmt.Sprintf("%.1f ±%.0f%%", med[impl][size]*1e6, 100*spread(runs[impl], size)))
			}
			hier := med["hier"][size]
			for _, impl := range impls {
				if impl != "hier" {
					row = append(row, fmt.Sprintf("%.2fx", med[impl][size]/hier))
				}
			}
			rows = append(rows, row)
		}
	}
	header := []string{"size", "ranks", "hosts"}
	for _, impl := range impls {
		header = append(header, impl+" µs")
	}
	for _, impl := range impls {
		if impl != "hier" {
			header = append(header, impl+"/hier")
		}
	}
	table(header, rows)
	return nil
}

// spread is (max-min)/median of the runs' times for one size.
func spread(runs []map[int]float64, size int) float64 {
	lo, hi := runs[0][size], runs[0][size]
	for _, r := range runs {
		lo, hi = min(lo, r[size]), max(hi, r[size])
	}
	med := medians(runs)[size]
	if med == 0 {
		return 0
	}
	return (hi - lo) / med
}

// runPeerAllReduce runs a peer: gloo (TCP), mpi-tcp or mpi-shm (OpenMPI's vader).
func runPeerAllReduce(ctx context.Context, impl, dir, mpiBin string, world int, sizes []int) (map[int]float64, error) {
	switch impl {
	case "gloo":
		return runGlooAllReduce(ctx, dir, world, sizes)
	case "mpi-tcp":
		return runMPIAllReduceOver(ctx, mpiBin, world, sizes, "tcp,self")
	case "mpi-shm":
		return runMPIAllReduceOver(ctx, mpiBin, world, sizes, "vader,self")
	case "tcp-ceiling":
		return runTCPCeiling(ctx, filepath.Join(dir, "tcp_stream"), world, sizes)
	}
	return nil, fmt.Errorf("no all-reduce peer %q", impl)
}

func runMPIAllReduceOver(ctx context.Context, bin string, world int, sizes []int, btl string) (map[int]float64, error) {
	args := []string{"--allow-run-as-root", "--oversubscribe", "-np", fmt.Sprint(world),
		"--mca", "pml", "ob1", "--mca", "btl", btl, "--mca", "btl_tcp_if_include", "lo", bin}
	cmd := exec.CommandContext(ctx, "mpirun", append(args, sizeSpecs(sizes)...)...)
	cmd.Env = append(os.Environ(), "OMPI_MCA_plm_rsh_agent=")
	lines, err := runRanks(ctx, []*exec.Cmd{cmd}, nil)
	return perOp(lines), err
}

// runTCPCeiling runs bench/peers/tcp_stream.c, one process per rank: the
// ring's traffic with no all-reduce around it.
func runTCPCeiling(ctx context.Context, bin string, world int, sizes []int) (map[int]float64, error) {
	addrs, err := freeAddrs(world)
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, world)
	for r := range world {
		cmds[r] = exec.CommandContext(ctx, bin, append([]string{strconv.Itoa(r), strconv.Itoa(world), strings.Join(addrs, ",")}, sizeSpecs(sizes)...)...)
	}
	lines, err := runRanks(ctx, cmds, nil)
	return perOp(lines), err
}

// runHostsAllReduce runs one process per simulated host, each with perHost ranks.
func runHostsAllReduce(ctx context.Context, mode string, hosts, perHost int, sizes []int) (map[int]float64, error) {
	cmds, err := selfRanks(ctx, hosts, func(host int, addrs string) []string {
		return append([]string{"allreduce-host", mode, strconv.Itoa(host), strconv.Itoa(perHost), addrs}, sizeSpecs(sizes)...)
	})
	if err != nil {
		return nil, err
	}
	lines, err := runRanks(ctx, cmds, nil)
	return perOp(lines), err
}

// allReduceHost is one simulated host of the hosts benchmark:
// MODE(ring|hier) HOST PER_HOST ADDRS SIZE:ITERS...; it prints one JSON line
// per size for each of its ranks.
func allReduceHost(args []string) error {
	if len(args) < 5 {
		return errors.New("usage: allreduce-host ring|hier HOST RANKS-PER-HOST ADDR,ADDR,... SIZE:ITERS... (a child process of bench allreduce -per-host)")
	}
	mode := args[0]
	hostAddrs := strings.Split(args[3], ",")
	host, err := indexArg("HOST", args[1], len(hostAddrs))
	if err != nil {
		return err
	}
	per, err := strconv.Atoi(args[2])
	if err != nil || per < 1 || per > 64 {
		return fmt.Errorf("RANKS-PER-HOST %q; want 1..64", args[2])
	}
	if mode != "ring" && mode != "hier" {
		return fmt.Errorf("mode %q; want ring or hier", mode)
	}
	for _, spec := range args[4:] {
		if _, _, err := sizeSpec(spec); err != nil {
			return err
		}
	}
	for i, a := range hostAddrs { // host i on 127.0.0.(i+2): an address of its own, as a host has
		_, port, _ := net.SplitHostPort(a)
		hostAddrs[i] = net.JoinHostPort(fmt.Sprintf("127.0.%d.%d", (i+2)/256, (i+2)%256), port)
	}
	world := per * len(hostAddrs)
	ln, err := collective.Listen(hostAddrs[host], nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Shared memory within a host; TCP between hosts, as between machines.
	opts := collective.Options{Secret: benchSecret, Transport: collective.TransportSameIP}
	type reducer interface {
		AllReduce(context.Context, []float32) error
		Barrier(context.Context) error
		Close() error
	}
	members := make([]reducer, per)
	errs := make([]error, per)
	var wg sync.WaitGroup
	switch mode {
	case "ring": // every rank its own member of one ring, sharing the host's listener as an agent's ranks do
		peers := make([]string, world)
		for r := range peers {
			peers[r] = hostAddrs[r/per]
		}
		for l := range per {
			wg.Go(func() {
				var g *collective.Group
				g, errs[l] = collective.Join(ctx, ln, collective.Gang{Run: "bench", Generation: 1, Peers: peers}, host*per+l, opts)
				if errs[l] == nil {
					members[l] = g
				}
			})
		}
	case "hier":
		h, err := collective.NewHost(host*per, per, world)
		if err != nil {
			return err
		}
		for l := range per {
			v, _ := h.Claim(l)
			members[l] = v
			wg.Go(func() {
				errs[l] = h.Join(ctx, ln, collective.Gang{Run: "bench", Generation: 1, Peers: hostAddrs}, opts)
			})
		}
	default:
		return fmt.Errorf("allreduce-host: mode %q; want ring or hier", mode)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	var mu sync.Mutex
	for _, spec := range args[4:] {
		size, iters, _ := sizeSpec(spec) // checked above
		for l := range per {
			wg.Go(func() {
				errs[l] = func() error {
					m := members[l]
					buf := make([]float32, size/4)
					for i := range buf {
						buf[i] = 1
					}
					for range max(2, iters/10) {
						if err := m.AllReduce(ctx, buf); err != nil {
							return err
						}
					}
					if err := m.Barrier(ctx); err != nil {
						return err
					}
					start := time.Now()
					for range iters {
						if err := m.AllReduce(ctx, buf); err != nil {
							return err
						}
					}
					elapsed := time.Since(start).Seconds()
					line, _ := json.Marshal(map[string]any{"rank": host*per + l, "bytes": size, "iters": iters, "seconds": elapsed})
					mu.Lock()
					fmt.Println(string(line))
					mu.Unlock()
					return nil
				}()
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	return nil
}
