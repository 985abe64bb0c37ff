package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/durabletrain/durabletrain/collective"
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
	fmt.Printf("\n# scaling: %d rounds of 1 rank, 2 ranks with %d-byte buckets overlapped with backward (moved by backward's\n", f.scalingRepeats, bucket)
	fmt.Printf("# own thread where the ranks fill the cores, and by a goroutine beside it), 2 ranks all-reducing after\n")
	fmt.Printf("# backward, and two 1-rank runs at once; %d epochs a run, the first not counted; GOMAXPROCS %d per rank\n\n", f.scalingEpochs, f.gomaxprocs)
	type config struct {
		name        string
		ranks       int
		bucketBytes int
		progress    string // collective.Options.Progress
		alone       bool   // two 1-rank runs at once, no communication: what the machine allows two ranks
	}
	configs := []config{
		{"1 rank", 1, bucket, f.progress, false},
		{"2 ranks, buckets overlapped", 2, bucket, f.progress, false},
		{"2 ranks, buckets on a goroutine", 2, bucket, collective.ProgressNever, false},
		{"2 ranks, one all-reduce after backward", 2, native.MaxBucketBytes, f.progress, false},
		{"two 1-rank runs at once, no all-reduce", 2, bucket, f.progress, true},
	}
	rates := make([][]float64, len(configs))
	for round := range f.scalingRepeats {
		for i, c := range configs {
			g := f
			g.bucketBytes, g.progress = c.bucketBytes, c.progress
			rate, err := scalingRun(ctx, g, c.ranks, c.alone)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			rates[i] = append(rates[i], rate)
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

// scalingRun is one run's samples/s over its epochs after the first: of a
// gang of ranks or, alone, of that many 1-rank runs at once, summed.
func scalingRun(ctx context.Context, f trainFlags, ranks int, alone bool) (float64, error) {
	rate := func(rows []map[string]any) float64 {
		if len(rows) > 1 {
			rows = rows[1:]
		}
		return meanOf(rows, "samples_per_second")
	}
	if !alone {
		rows, err := runOurTraining(ctx, f, ranks, f.scalingEpochs, false)
		return rate(rows), err
	}
	rates := make([]float64, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			var rows []map[string]any
			rows, errs[r] = runOurTraining(ctx, f, 1, f.scalingEpochs, false)
			rates[r] = rate(rows)
		})
	}
	wg.Wait()
	var sum float64
	for _, r := range rates {
		sum += r
	}
	return sum, errors.Join(errs...)
}
