package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/durabletrain/durabletrain/trainer/native"
)

// trainScaling prints how 2 ranks scale against twice 1 rank (issue 15's
// target: 90%), with the gradient all-reduced in buckets while backward runs
// and, as the peer in the same rounds, all-reduced in one piece after it.
// Rounds interleave the three runs so that a slow minute of the machine
// falls on all of them; every figure is the median over rounds with its
// range.
func trainScaling(ctx context.Context, f trainFlags) error {
	if f.scalingRepeats <= 0 {
		return nil
	}
	bucket := f.bucketBytes
	if bucket == 0 {
		bucket = native.DefaultBucketBytes
	}
	fmt.Printf("\n# scaling: %d rounds of 1 rank, 2 ranks with %d-byte buckets overlapped with backward, and 2 ranks\n", f.scalingRepeats, bucket)
	fmt.Printf("# all-reducing after backward; %d epochs a run, the first not counted; GOMAXPROCS %d per rank\n\n", f.scalingEpochs, f.gomaxprocs)
	type config struct {
		name        string
		ranks       int
		bucketBytes int
	}
	configs := []config{
		{"1 rank", 1, bucket},
		{"2 ranks, buckets overlapped", 2, bucket},
		{"2 ranks, one all-reduce after backward", 2, native.MaxBucketBytes},
	}
	rates := make([][]float64, len(configs))
	for round := range f.scalingRepeats {
		for i, c := range configs {
			g := f
			g.bucketBytes = c.bucketBytes
			rows, err := runOurTraining(ctx, g, c.ranks, f.scalingEpochs, false)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if len(rows) > 1 {
				rows = rows[1:]
			}
			rates[i] = append(rates[i], meanOf(rows, "samples_per_second"))
			fmt.Printf("round %d  %-40s %8.0f samples/s\n", round+1, c.name, rates[i][round])
		}
	}
	fmt.Println()
	span := func(xs []float64, f string) string {
		s := slices.Clone(xs)
		slices.Sort(s)
		return fmt.Sprintf(f+" ("+f+"–"+f+")", s[len(s)/2], s[0], s[len(s)-1])
	}
	var rows [][]string
	for i, c := range configs {
		row := []string{c.name, span(rates[i], "%.0f"), "", ""}
		if c.ranks == 2 {
			eff := make([]float64, len(rates[i]))
			for r := range eff {
				eff[r] = 100 * rates[i][r] / (2 * rates[0][r])
			}
			row[2], row[3] = span(eff, "%.1f%%"), ">= 90%"
		}
		rows = append(rows, row)
	}
	table([]string{"run", "samples/s, median (range)", "of twice 1 rank, same round", "target"}, rows)
	return nil
}
