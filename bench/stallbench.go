package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// benchStall measures what a checkpoint costs training: a native trainer
// whose state (weights and Adam's two moments) is about size bytes trains
// the same steps three ways, interleaved: without checkpoints; with one
// every interval steps saved in the foreground (training waits for the
// write, hash, fsync and manifest); and in the background as the
// activities save them with checkpoint.async (a snapshot in memory, then
// the same commit on another goroutine, one in flight at most), once with
// each snapshot handed back after its save (trainer.SnapshotRecycler: the
// next copies into its memory) and once without. The peer of the stall is
// the time to copy the state's bytes into memory touched before, as a
// recycled snapshot's is; a copy into fresh memory is shown beside it.
func benchStall(ctx context.Context, dir string, size, repeat int, data, directIO string) error {
	train, err := dataset.Load(ctx, data, dataset.Train)
	if err != nil {
		return err
	}
	test, err := dataset.Load(ctx, data, dataset.Test)
	if err != nil {
		return err
	}
	// Two hidden layers of h: about h² + 795h weights; three floats per weight.
	weights, in := float64(size/12), float64(train.Features()+11)
	hidden := max(1, int((math.Sqrt(in*in+4*weights)-in)/2))
	tr, err := native.New(native.Config{Hidden: []int{hidden, hidden}, BatchSize: 8, Seed: 1}, train, test, nil)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.Init(ctx); err != nil {
		return err
	}
	probe, _ := tr.Snapshot(ctx)
	stateBytes := probe.Bytes()
	probe = nil

	step := 0
	trainTo := func(n int) (time.Duration, error) {
		t := time.Now()
		step += n
		_, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: step})
		return time.Since(t), err
	}
	// Calibrate: a step's time and a foreground save's, so that the
	// interval gives a background save time to finish before the next. The
	// first steps touch the optimizer's moments for the first time (fresh
	// pages), so they are not timed: a step timed too slow makes the
	// interval too few steps, shorter than a background save.
	if _, err := trainTo(2); err != nil {
		return err
	}
	stepTime, err := trainTo(3)
	if err != nil {
		return err
	}
	stepTime /= 3
	root := filepath.Join(dir, "stall")
	defer os.RemoveAll(root)
	store, err := checkpoint.Open(ctx, fileURL(root, "create_dir=1&metadata=skip&"+checkpoint.DirectIOParam+"="+directIO), nil)
	if err != nil {
		return err
	}
	defer store.Close()
	// save commits a checkpoint at c whose objects write puts, as the activities do.
	save := func(ctx context.Context, c trainer.Cursor, write func(context.Context, trainer.StateWriter) error) error {
		w, err := store.Begin(ctx, "stall", c.Epoch, c.Step)
		if err != nil {
			return err
		}
		if err := write(ctx, w); err != nil {
			return err
		}
		if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
			return err
		}
		_, err = store.Prune(ctx, "stall", checkpoint.Retention{KeepLast: 1})
		return err
	}
	foreground := func() error { return save(ctx, tr.Cursor(), tr.Save) }
	// The slower of two saves: the first may write into warmer memory or a
	// quieter disk than the rest.
	var slowest time.Duration
	for range 2 {
		t := time.Now()
		if err := foreground(); err != nil {
			return err
		}
		slowest = max(slowest, time.Since(t))
	}
	interval := max(2, int(math.Ceil(3*slowest.Seconds()/stepTime.Seconds())))
	const checkpoints = 3

	// background trains with a checkpoint every interval steps, each a
	// snapshot committed on another goroutine, one in flight at most; with
	// recycle, each snapshot is handed back once its save is done
	// (trainer.SnapshotRecycler), as the activities do.
	type backgroundRun struct {
		loop, stalled, waited time.Duration
		snaps, saves          []float64
	}
	background := func(recycle bool) (backgroundRun, error) {
		var r backgroundRun
		if !recycle {
			tr.Snapshot(ctx) // untimed: takes the memory the last one handed back, if any
		}
		var pending chan error
		saved := make(chan float64, checkpoints)
		for range checkpoints {
			d, err := trainTo(interval)
			if err != nil {
				return r, err
			}
			t := time.Now()
			if pending != nil {
				if err := <-pending; err != nil {
					return r, err
				}
			}
			r.waited += time.Since(t)
			ts := time.Now()
			snap, err := tr.Snapshot(ctx)
			if err != nil {
				return r, err
			}
			r.snaps = append(r.snaps, time.Since(ts).Seconds())
			pending = make(chan error, 1)
			go func(c trainer.Cursor) {
				t := time.Now()
				err := save(ctx, c, snap.WriteTo)
				saved <- time.Since(t).Seconds()
				if recycle {
					tr.Recycle(snap)
				}
				pending <- err
			}(tr.Cursor())
			r.stalled += time.Since(t)
			r.loop += d + time.Since(t)
		}
		if err := <-pending; err != nil { // the last one, outside the loop: the next interval would hide it
			return r, err
		}
		for range checkpoints {
			r.saves = append(r.saves, <-saved)
		}
		return r, nil
	}

	var copyT, copyWarmT, copySplitT, none, fg, fgStall []float64
	copiers := min(runtime.GOMAXPROCS(0), 4)                 // as native.Trainer.Snapshot
	var snapT, bg, bgStall, bgWait, bgSave []float64         // snapshots handed back (the default)
	var snapOnceT, bgOnce, bgOnceStall, bgOnceSave []float64 // snapshots never handed back: fresh memory for each
	// The peers' memory: the state's bytes, and a copy's destination touched once.
	src := make([]byte, stateBytes)
	for i := range src {
		src[i] = byte(i)
	}
	warm := bytes.Clone(src)
	// One round more than asked, the first not counted: on a virtual
	// machine the first touch of fresh memory can cost many times a copy.
	for round := range repeat + 1 {
		if round == 1 {
			copyT, copyWarmT, copySplitT, none, fg, fgStall = nil, nil, nil, nil, nil, nil
			snapT, bg, bgStall, bgWait, bgSave = nil, nil, nil, nil, nil
			snapOnceT, bgOnce, bgOnceStall, bgOnceSave = nil, nil, nil, nil
		}
		// The peers: copy the state's bytes into fresh memory, and into memory touched before.
		t := time.Now()
		dst := bytes.Clone(src)
		copyT = append(copyT, time.Since(t).Seconds())
		_, dst = dst[0], nil
		t = time.Now()
		copy(warm, src)
		copyWarmT = append(copyWarmT, time.Since(t).Seconds())
		// The same copy split among as many goroutines as the snapshot's (up
		// to 4, the processor count): like with like for the snapshot itself.
		t = time.Now()
		splitCopy(warm, src, copiers)
		copySplitT = append(copySplitT, time.Since(t).Seconds())

		// No checkpoints.
		var loop time.Duration
		for range checkpoints {
			d, err := trainTo(interval)
			if err != nil {
				return err
			}
			loop += d
		}
		none = append(none, loop.Seconds())

		// Foreground: training waits for each save.
		loop = 0
		var stalled time.Duration
		for range checkpoints {
			d, err := trainTo(interval)
			if err != nil {
				return err
			}
			t := time.Now()
			if err := foreground(); err != nil {
				return err
			}
			stalled += time.Since(t)
			loop += d + time.Since(t)
		}
		fg = append(fg, loop.Seconds())
		fgStall = append(fgStall, stalled.Seconds()/checkpoints)

		// Background, with snapshots handed back and without, in an order that alternates by round.
		for k := range 2 {
			recycle := (round+k)%2 == 0
			r, err := background(recycle)
			if err != nil {
				return err
			}
			if recycle {
				snapT, bgSave = append(snapT, r.snaps...), append(bgSave, r.saves...)
				bg, bgStall = append(bg, r.loop.Seconds()), append(bgStall, r.stalled.Seconds()/checkpoints)
				bgWait = append(bgWait, r.waited.Seconds()/checkpoints)
			} else {
				snapOnceT, bgOnceSave = append(snapOnceT, r.snaps...), append(bgOnceSave, r.saves...)
				bgOnce, bgOnceStall = append(bgOnce, r.loop.Seconds()), append(bgOnceStall, r.stalled.Seconds()/checkpoints)
			}
		}
	}
	ms := func(xs []float64) string { return fmt.Sprintf("%.0f", 1000*median(xs)) }
	spread := func(xs []float64) string {
		lo, hi := xs[0], xs[0]
		for _, x := range xs {
			lo, hi = min(lo, x), max(hi, x)
		}
		return fmt.Sprintf("%.0f–%.0f", 1000*lo, 1000*hi)
	}
	perCkpt := func(loop, base []float64) []float64 {
		out := make([]float64, len(loop))
		for i := range loop {
			out[i] = (loop[i] - base[i]) / checkpoints
		}
		return out
	}
	fmt.Printf("\n# what a checkpoint costs training: native trainer, two hidden layers of %d (a %s state), batch 8, %d checkpoints every %d steps (%.0f ms a step when calibrated, %.0f ms without checkpoints; a foreground save %.0f ms), direct_io=%s, median of %d interleaved runs after one not counted\n\n",
		hidden, humanBytes(int(stateBytes)), checkpoints, interval, 1000*stepTime.Seconds(), 1000*median(none)/float64(checkpoints*interval), 1000*slowest.Seconds(), directIO, repeat)
	ratio := func(xs []float64) string { return fmt.Sprintf("%.2fx", median(xs)/median(copyWarmT)) }
	table([]string{"measure", "ms", "spread", "/ copy into touched memory", "target"}, [][]string{
		{"copy the state's bytes into memory touched before (the peer)", ms(copyWarmT), spread(copyWarmT), ratio(copyWarmT), ""},
		{"copy the state's bytes into fresh memory", ms(copyT), spread(copyT), ratio(copyT), ""},
		{fmt.Sprintf("the copy into touched memory split among %d goroutines, as the snapshot's", copiers), ms(copySplitT), spread(copySplitT), ratio(copySplitT), ""},
		{"snapshot, into the memory of the one handed back (trainer.SnapshotRecycler)", ms(snapT), spread(snapT), ratio(snapT), ""},
		{"stall per checkpoint, background (checkpoint.async)", ms(bgStall), spread(bgStall), ratio(bgStall), "<= 1.5x"},
		{"  of which waiting for the previous save to commit", ms(bgWait), spread(bgWait), ratio(bgWait), ""},
		{"training slowed per checkpoint, background (loop time vs none)", ms(perCkpt(bg, none)), spread(perCkpt(bg, none)), ratio(perCkpt(bg, none)), ""},
		{"a background save, snapshot to commit, while training runs", ms(bgSave), spread(bgSave), ratio(bgSave), ""},
		{"snapshot into fresh memory (none handed back)", ms(snapOnceT), spread(snapOnceT), ratio(snapOnceT), ""},
		{"stall per checkpoint, background, none handed back", ms(bgOnceStall), spread(bgOnceStall), ratio(bgOnceStall), ""},
		{"training slowed per checkpoint, background, none handed back", ms(perCkpt(bgOnce, none)), spread(perCkpt(bgOnce, none)), ratio(perCkpt(bgOnce, none)), ""},
		{"a background save, none handed back", ms(bgOnceSave), spread(bgOnceSave), ratio(bgOnceSave), ""},
		{"stall per checkpoint, foreground", ms(fgStall), spread(fgStall), ratio(fgStall), ""},
	})
	return nil
}

// splitCopy copies src into dst (as long) in k equal parts at once.
func splitCopy(dst, src []byte, k int) {
	var wg sync.WaitGroup
	for i := range k {
		lo, hi := i*len(src)/k, (i+1)*len(src)/k
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	wg.Wait()
}
