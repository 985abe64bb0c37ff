// Command bench prints durabletrain's benchmark tables, each with peer rows
// measured in the same run (ratios, never absolute targets):
//
//	bench allreduce    ring all-reduce vs torch.distributed gloo and OpenMPI over TCP
//	bench train        native trainer vs PyTorch: accuracy, 1-rank and 2-rank throughput
//	bench checkpoint   1 GiB checkpoint save and load vs dd
//	bench s3           1 GiB checkpoint save and restore on MinIO vs the AWS CLI
//	bench scale        one run on a simulated fleet of GPU hosts: Temporal's cost per epoch
//	bench contention   many runs at once on one simulated fleet: waits and busy slots
//	bench tune         one search of many trials on a simulated fleet, within Temporal's limits
//	bench search       TPE vs random search on the same budget of real trainings, seed by seed
//	bench pbt          population-based training vs fixed hyperparameters, real trials on a simulated fleet
//	bench ray          the same jobs through Ray Train and through durabletrain (bench/ray)
//
// Run `bench <table> -h` for its flags. The peers come from Debian's packages
// (make deps-bench installs them).
package main

import (
	"fmt"
	"os"
	"strings"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
)

var tables = map[string]func(args []string) error{
	"allreduce":  benchAllReduce,
	"train":      benchTrain,
	"checkpoint": benchCheckpoint,
	"s3":         benchS3,
	"scale":      benchScale,
	"contention": benchContention,
	"tune":       benchTune,
	"search":     benchSearch,
	"pbt":        benchPBT,
	"ray":        benchRay,
	// Child processes the tables start: one rank each.
	"allreduce-rank": allReduceRank,
	"spin":           spin,
	"allreduce-host": allReduceHost,
	"train-rank":     trainRank,
}

func main() {
	if len(os.Args) < 2 || tables[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: bench allreduce|train|checkpoint|s3|scale|contention|tune|search|pbt|ray [flags]")
		os.Exit(2)
	}
	if err := tables[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench "+os.Args[1]+":", err)
		os.Exit(1)
	}
}

// table prints rows under a header with aligned columns.
func table(header []string, rows [][]string) {
	widths := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	line := func(r []string) {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = fmt.Sprintf("%*s", widths[i], c)
		}
		fmt.Println("| " + strings.Join(cells, " | ") + " |")
	}
	line(header)
	sep := make([]string, len(header))
	for i, w := range widths {
		sep[i] = strings.Repeat("-", w)
	}
	fmt.Println("|-" + strings.Join(sep, "-|-") + "-|")
	for _, r := range rows {
		line(r)
	}
}
