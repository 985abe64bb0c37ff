// Command chaos runs durabletrain under injected faults and prints what they
// cost. It builds devserver and worker, makes each worker a host of its own
// (a network namespace; root is needed), trains an uninterrupted reference
// run, then runs with faults drawn from the seed, and checks every run
// completed with weights bit-identical to the reference.
//
//	chaos -faults 24 -seed 1 [-recovery survivor|storage|both]
//
// With -recovery both (the default) the same plan runs twice: new gangs
// restoring from a survivor's memory, then from storage.
//
// Exit status 1 if a guarantee did not hold.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
	"github.com/durabletrain/durabletrain/chaos"
	"github.com/durabletrain/durabletrain/internal/buildinfo"
)

func main() {
	var cfg chaos.Config
	flag.Int64Var(&cfg.Seed, "seed", 1, "seed of the fault plan (kinds, phases, targets)")
	flag.IntVar(&cfg.Faults, "faults", 24, "faults to inject in all")
	kinds := flag.String("kinds", strings.Join(chaos.Kinds, ","), "fault kinds to draw from")
	flag.IntVar(&cfg.FaultsPerRun, "faults-per-run", 3, "faults per training run")
	flag.IntVar(&cfg.Epochs, "epochs", 8, "epochs per run")
	flag.IntVar(&cfg.Hosts, "hosts", 3, "worker hosts of one slot each: 3 gives the 2-rank gang a spare; 2 gives it none")
	flag.StringVar(&cfg.Dataset, "dataset", "", "dataset URL (default the full Fashion-MNIST)")
	dir := flag.String("dir", ".durabletrain/chaos", "work directory (wiped first)")
	tags := flag.String("tags", "openblas", "build tags of the worker")
	recovery := flag.String("recovery", "both", "how new gangs restore: survivor (failure.recover_from_peers, the default), storage (the latest checkpoint), or both, one after the other on the same seed")
	flag.DurationVar(&cfg.HeartbeatLimit, "heartbeat-timeout", chaos.DefaultHeartbeatLimit, "the runs' failure.heartbeat_timeout")
	flag.DurationVar(&cfg.StallLimit, "stall-timeout", chaos.DefaultStallLimit, "the runs' failure.stall_timeout: how long a silent ring neighbour (SIGSTOP, partition) goes unnoticed")
	flag.DurationVar(&cfg.StickyTimeout, "sticky-timeout", 0, "the workers' -sticky-timeout (0: their default)")
	version := flag.Bool("version", false, "print the version and build ID, and exit")
	flag.Parse()
	if *version {
		fmt.Println(buildinfo.String("chaos"))
		return
	}
	cfg.Kinds = strings.Split(*kinds, ",")
	cfg.Log = os.Stderr
	if err := os.RemoveAll(*dir); err != nil {
		fail(err)
	}
	cfg.Dir, _ = filepath.Abs(*dir)
	cfg.Bin = filepath.Join(cfg.Dir, "bin")
	if err := chaos.Build(cfg.Bin, *tags, os.Stderr); err != nil {
		fail(err)
	}
	modes := map[string][]bool{"survivor": {false}, "storage": {true}, "both": {false, true}}[*recovery]
	if modes == nil {
		fail(fmt.Errorf("-recovery %q; want survivor, storage or both", *recovery))
	}
	var problems, costs []string
	for _, fromStorage := range modes {
		mode := map[bool]string{false: "survivor", true: "storage"}[fromStorage]
		c := cfg
		c.FromStorage = fromStorage
		c.Dir = filepath.Join(cfg.Dir, mode)
		start := time.Now()
		rep, err := chaos.Run(context.Background(), c)
		fmt.Printf("\n## New gangs restore from: %s (seed %d; failure.heartbeat_timeout %v, failure.stall_timeout %v)\n\n", mode, cfg.Seed, cfg.HeartbeatLimit, cfg.StallLimit)
		if rep != nil {
			rep.Print(os.Stdout)
		}
		if err != nil {
			fail(err)
		}
		fmt.Printf("\n%d faults in %d runs, %v; %s\n", len(rep.Faults), len(rep.Runs), time.Since(start).Round(time.Second), rep.Costs())
		costs = append(costs, mode+": "+rep.Costs())
		problems = append(problems, rep.Problems()...)
	}
	if len(modes) > 1 {
		fmt.Println("\n## Side by side")
		for _, c := range costs {
			fmt.Println("- " + c)
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "chaos: NOT MET:", p)
		}
		os.Exit(1)
	}
	fmt.Println("every run completed, with final weights bit-identical to the uninterrupted run")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "chaos:", err)
	os.Exit(1)
}
