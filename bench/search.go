package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
	"github.com/durabletrain/durabletrain/tune"
)

// defaultSearchSpace is the space `bench search` searches: the native
// MLP's learning rate, batch, width, optimizer and weight decay, through
// the trial's config (the keys the native trainer reads).
const defaultSearchSpace = `{
	"config.lr": {"loguniform": [1e-5, 1]},
	"config.batch_size": {"choice": [32, 64, 128, 256, 512]},
	"config.hidden": {"choice": [[32], [128], [512], [128, 64], [256, 128], [512, 256]]},
	"config.optimizer": {"choice": ["adam", "sgd"]},
	"config.weight_decay": {"loguniform": [1e-6, 0.1]}}`

// benchSearch is `bench search`: TPE against random search on the same
// budget of real trainings (the native MLP on Fashion-MNIST), seed by seed.
// Each search runs its trials one at a time, in process, through the same
// functions TuneWorkflow calls (tune.Trials for random search, the
// searcher's Suggest and Observe for TPE), so it measures the searchers,
// not Temporal; with one trial at a time the workflow makes exactly these
// choices (workflows.TestTuneWithTPE). Every trial trains from the same
// weight seed, so a config always scores the same.
func benchSearch(args []string) error {
	fs := flag.NewFlagSet("search", flag.ContinueOnError)
	trials := fs.Int("trials", 30, "trials per search (num_samples)")
	seedList := fs.String("seeds", "1,2,3", "search seeds, comma-separated")
	epochs := fs.Int("epochs", 1, "epochs per trial")
	examples := fs.Int("train-examples", 20000, "train on the first this many examples (0: all 60,000)")
	data := fs.String("data", dataset.DefaultURL, "Fashion-MNIST bucket URL")
	spaceJSON := fs.String("space", defaultSearchSpace, "param_space, as JSON")
	startup := fs.Int("n-startup-trials", 10, "TPE's random trials before its model")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var space map[string]tune.Domain
	if err := json.Unmarshal([]byte(*spaceJSON), &space); err != nil {
		return fmt.Errorf("-space: %w", err)
	}
	var seeds []uint64
	for _, s := range strings.Split(*seedList, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return fmt.Errorf("-seeds: %q is not a seed", s)
		}
		seeds = append(seeds, v)
	}
	ctx := context.Background()
	train, test, err := dataset.LoadIDX(ctx, *data)
	if err != nil {
		return err
	}
	if *examples > 0 {
		train = train.Head(*examples)
	}
	base := json.RawMessage(fmt.Sprintf(`{"hyper": {"epochs": %d}}`, *epochs))
	fmt.Printf("# TPE vs random search: %d trials each, one at a time; native MLP, %d epoch(s) on %d training examples, scored on %d test examples\n",
		*trials, *epochs, train.Len(), test.Len())
	fmt.Printf("# space: %s\n\n", strings.Join(strings.Fields(*spaceJSON), " "))

	half := *trials / 2
	var rows [][]string
	type outcome struct{ best []float64 }
	var sums [4]float64 // random@half, random@all, tpe@half, tpe@all
	var reach []int
	for _, seed := range seeds {
		var results [2]outcome
		for k, alg := range []string{tune.SearchRandom, tune.SearchTPE} {
			start := time.Now()
			next, observe, err := searcherFor(alg, base, space, *trials, seed, *startup)
			if err != nil {
				return err
			}
			best, failed := math.Inf(-1), 0
			for i := range *trials {
				cfg := next(i)
				acc, err := trainTrial(ctx, base, cfg, train, test)
				if err != nil {
					failed++
					acc = math.NaN()
				} else {
					best = math.Max(best, acc)
				}
				observe(i, cfg, acc)
				results[k].best = append(results[k].best, best)
			}
			fmt.Printf("seed %d %-6s best %.4f after %d trials, %.4f after %d (%d failed, %.0fs)\n",
				seed, alg, results[k].best[half-1], half, best, *trials, failed, time.Since(start).Seconds())
		}
		rnd, tpe := results[0].best, results[1].best
		n := -1
		for i, v := range tpe {
			if v >= rnd[len(rnd)-1] {
				n = i + 1
				break
			}
		}
		reach = append(reach, n)
		sums[0] += rnd[half-1]
		sums[1] += rnd[len(rnd)-1]
		sums[2] += tpe[half-1]
		sums[3] += tpe[len(tpe)-1]
		reached := "never"
		if n > 0 {
			reached = strconv.Itoa(n)
		}
		rows = append(rows, []string{strconv.FormatUint(seed, 10), f4(rnd[half-1]), f4(rnd[len(rnd)-1]), f4(tpe[half-1]), f4(tpe[len(tpe)-1]), reached})
	}
	m := float64(len(seeds))
	meanReach := "never"
	total, all := 0, true
	for _, n := range reach {
		if n < 0 {
			all = false
		}
		total += n
	}
	if all {
		meanReach = fmt.Sprintf("%.1f", float64(total)/m)
	}
	rows = append(rows, []string{"mean", f4(sums[0] / m), f4(sums[1] / m), f4(sums[2] / m), f4(sums[3] / m), meanReach})
	fmt.Println()
	table([]string{"seed", fmt.Sprintf("random best @%d", half), fmt.Sprintf("random best @%d", *trials),
		fmt.Sprintf("tpe best @%d", half), fmt.Sprintf("tpe best @%d", *trials), fmt.Sprintf("tpe trials to random's best @%d", *trials)}, rows)
	return nil
}

func f4(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

// searcherFor is a search's choices as TuneWorkflow makes them, one trial
// at a time: random search's trials expanded ahead, or a model-based
// searcher's suggestions from the trials before.
func searcherFor(alg string, base json.RawMessage, space map[string]tune.Domain, n int, seed uint64, startup int) (
	next func(int) map[string]json.RawMessage, observe func(int, map[string]json.RawMessage, float64), err error) {
	if alg == tune.SearchRandom {
		trials, err := tune.Trials(base, space, n, seed)
		if err != nil {
			return nil, nil, err
		}
		return func(i int) map[string]json.RawMessage { return trials[i].Config },
			func(int, map[string]json.RawMessage, float64) {}, nil
	}
	s, err := tune.NewSearcher(tune.SearcherConfig{Type: alg, NStartupTrials: startup}, space, "max", seed)
	if err != nil {
		return nil, nil, err
	}
	return s.Suggest, s.Observe, nil
}

// trainTrial trains one trial's spec on one rank and returns its test accuracy.
func trainTrial(ctx context.Context, base json.RawMessage, cfg map[string]json.RawMessage, train, test *dataset.Set) (float64, error) {
	sp, err := tune.Apply(base, cfg)
	if err != nil {
		return 0, err
	}
	sp = sp.WithDefaults()
	tr, err := native.New(native.ConfigOf(sp, sp.Hyper.BatchSize), train, test, trainer.Local{})
	if err != nil {
		return 0, err
	}
	defer tr.Close()
	if err := tr.Init(ctx); err != nil {
		return 0, err
	}
	for e := range sp.Hyper.Epochs {
		if _, err := tr.TrainEpoch(ctx, e, trainer.EpochOptions{}); err != nil {
			return 0, err // a diverged trial (trainer.ErrDiverged) fails, as it would in a search
		}
	}
	ev, err := tr.Evaluate(ctx)
	if err != nil {
		return 0, err
	}
	return ev.TestAccuracy, nil
}
