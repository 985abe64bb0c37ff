package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"go.uber.org/zap"
	"gocloud.dev/blob"
)

// Retention says which checkpoints of a run to keep, as Ray's CheckpointConfig does.
type Retention struct {
	KeepLast int    `json:"keep_last,omitempty"` // the newest N committed checkpoints; 0 keeps every one
	KeepBest int    `json:"keep_best,omitempty"` // also the best K by Score
	Score    string `json:"score,omitempty"`     // the metric that ranks them, e.g. "test_accuracy"
	Mode     string `json:"mode,omitempty"`      // "max" or "min"
}

// Validate names the first field that is out of range.
func (r Retention) Validate() error {
	switch {
	case r.KeepLast < 0:
		return fmt.Errorf("checkpoint.keep_last is %d; want 0 (keep all) or more", r.KeepLast)
	case r.KeepBest < 0:
		return fmt.Errorf("checkpoint.keep_best is %d; want 0 or more", r.KeepBest)
	case r.KeepBest > 0 && r.Score == "":
		return fmt.Errorf("checkpoint.keep_best is %d but checkpoint.score is empty; name the metric that ranks checkpoints, e.g. \"test_accuracy\"", r.KeepBest)
	case r.Mode != "" && r.Mode != "max" && r.Mode != "min":
		return fmt.Errorf("checkpoint.mode is %q; want \"max\" or \"min\"", r.Mode)
	case r.KeepBest > 0 && r.Mode == "":
		return errors.New("checkpoint.mode is empty; want \"max\" or \"min\" for checkpoint.score")
	}
	return nil
}

// Prune deletes the checkpoints of run that the retention policy does not
// keep, and leftovers of writes that never committed, older than the newest
// commit. It never deletes the latest verified checkpoint, nor anything newer
// than it (a write may be in progress there). It returns the IDs it deleted.
func (s *Store) Prune(ctx context.Context, run string, r Retention) ([]string, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	ids, err := s.IDs(ctx, run)
	if err != nil {
		return nil, err
	}
	committed := map[string]Manifest{}
	var order []string // committed IDs, oldest first
	for _, id := range ids {
		m, err := s.readManifest(ctx, run, id, nil)
		if err == nil {
			committed[id] = m
			order = append(order, id)
			continue
		}
		if _, ok := damaged(err); !ok {
			// A manifest the store did not hand over may be a kept one:
			// nothing is deleted on a guess.
			return nil, fmt.Errorf("checkpoint: not pruning %s: %w", run, err)
		}
	}
	if len(order) == 0 {
		return nil, nil
	}
	keep := map[string]bool{}
	if r.KeepLast == 0 {
		for _, id := range order {
			keep[id] = true
		}
	} else {
		for _, id := range order[max(0, len(order)-r.KeepLast):] {
			keep[id] = true
		}
	}
	if r.KeepBest > 0 {
		var scored []string
		for _, id := range order {
			if v, ok := committed[id].Metrics[r.Score]; ok && !math.IsNaN(v) {
				scored = append(scored, id)
			}
		}
		sign := 1.0
		if r.Mode == "min" {
			sign = -1
		}
		slices.SortStableFunc(scored, func(a, b string) int { // best first; among equals, newest first
			va, vb := sign*committed[a].Metrics[r.Score], sign*committed[b].Metrics[r.Score]
			switch {
			case va > vb:
				return -1
			case va < vb:
				return 1
			case a > b:
				return -1
			}
			return 1
		})
		for _, id := range scored[:min(len(scored), r.KeepBest)] {
			keep[id] = true
		}
	}
	var doomed []string
	for _, id := range ids {
		if !keep[id] && id < order[len(order)-1] {
			doomed = append(doomed, id)
		}
	}
	if len(doomed) == 0 {
		return nil, nil
	}
	latest, err := s.LatestVerified(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: not pruning %s: %w", run, err)
	}
	var deleted []string
	for _, id := range doomed {
		if id >= latest.Manifest.ID {
			continue
		}
		if err := s.delete(ctx, run, id); err != nil {
			return deleted, err
		}
		s.log.Info("checkpoint deleted by retention", zap.String("run", run), zap.String("id", id))
		deleted = append(deleted, id)
	}
	return deleted, nil
}

// delete uncommits a checkpoint (manifest first), then removes its objects.
func (s *Store) delete(ctx context.Context, run, id string) error {
	p := prefix(run, id)
	keys := []string{p + ManifestName}
	it := s.bucket.List(&blob.ListOptions{Prefix: p})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("checkpoint: listing %s/%s: %w", run, id, err)
		}
		if obj.Key != p+ManifestName {
			keys = append(keys, obj.Key)
		}
	}
	for _, k := range keys {
		if err := s.bucket.Delete(ctx, k); err != nil && !isNotFound(err) {
			return fmt.Errorf("checkpoint: deleting %s: %w", k, err)
		}
	}
	return nil
}
