package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
)

// progress queries the run; nil while the server does not answer.
func (h *Harness) progress(ctx context.Context, id string) *spec.Progress {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := h.client.QueryWorkflow(qctx, id, "", spec.QueryProgress)
	if err != nil {
		return nil
	}
	var p spec.Progress
	if v.Get(&p) != nil {
		return nil
	}
	return &p
}

// costs fills in what each fault of a run cost from the "restored"
// incident of the first gang formed after it (rank 0 reports it once the
// gang agreed on its state). Where the next fault broke that gang before
// then, the fault's cost is not known and stays blank (with a note), not
// taken from the next fault's gang.
func costs(faults []Fault, p *spec.Progress) {
	stepsPerEpoch := 0
	for _, m := range p.Metrics {
		stepsPerEpoch = max(stepsPerEpoch, m.Steps)
	}
	for i := range faults {
		f := &faults[i]
		if f.Detected == 0 {
			continue // no gang broke (a server restart, or a host that held no slot of it)
		}
		// The generations this fault's recovery can have used: up to the
		// one the next fault that broke a gang struck.
		until := math.MaxInt
		for _, next := range faults[i+1:] {
			if next.Detected > 0 {
				until = next.gen
				break
			}
		}
		found := false
		for _, inc := range p.Incidents {
			if inc.Kind != spec.IncidentRestored || inc.Restore == nil || inc.Generation <= f.gen || inc.Generation > until {
				continue
			}
			found = true
			rr := inc.Restore
			f.RestoredFrom, f.BlobBytes = "storage", rr.Bytes
			if rr.Peer != nil {
				f.RestoredFrom = "survivor"
			}
			if at := rr.SurvivorsAt; at != nil && stepsPerEpoch > 0 {
				from := rr.Restored()
				f.StepsLost = (at.Epoch-from.Epoch)*stepsPerEpoch + at.Step - from.Step
			}
			break
		}
		if !found && until != math.MaxInt {
			f.Note = strings.TrimPrefix(f.Note+"; the next fault broke the new gang before its restore was recorded", "; ")
		}
	}
}

// finalState is the SHA-256 of the final checkpoint's objects, verified.
func (h *Harness) finalState(ctx context.Context, p *spec.Progress) (string, error) {
	if p == nil || p.Latest == nil {
		return "", errors.New("no final checkpoint")
	}
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		return "", err
	}
	defer store.Close()
	c, err := store.Verify(ctx, p.Latest.Run, p.Latest.ID)
	if err != nil {
		return "", fmt.Errorf("final checkpoint %s: %w", p.Latest.ID, err)
	}
	if c.Manifest.Epoch != h.cfg.Epochs || c.Manifest.Step != 0 {
		return "", fmt.Errorf("final checkpoint %s is at epoch %d step %d", c.Manifest.ID, c.Manifest.Epoch, c.Manifest.Step)
	}
	var sums []string
	for _, o := range c.Manifest.Objects {
		sums = append(sums, o.Name+":"+o.Hash())
	}
	return strings.Join(sums, ","), nil
}

// waitPhase waits until the run is in the phase, and returns the progress then.
func (h *Harness) waitPhase(ctx context.Context, id, phase string) (*spec.Progress, string) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p := h.progress(ctx, id)
		switch {
		case p == nil:
		case p.State == spec.StateCompleted || p.State == spec.StateFailed:
			return p, phase
		case phase == PhaseGang && p.State == spec.StateFormingGang:
			time.Sleep(time.Duration(h.rng.IntN(300)) * time.Millisecond)
			return h.progress(ctx, id), phase
		case phase == PhaseGang && p.State == spec.StateTraining:
			return p, PhaseEpoch // the gang formed before we could strike
		case phase != PhaseGang && p.State == spec.StateTraining && !h.gangAlive(p):
			// A host of the gang is down (struck by the last fault before
			// the gang formed without it knowing): the run has yet to
			// notice; strike once it has a gang of live hosts again.
		case phase == PhaseEpoch && p.State == spec.StateTraining && len(p.Gang) > 0:
			time.Sleep(time.Duration(200+h.rng.IntN(800)) * time.Millisecond)
			return h.progress(ctx, id), phase
		case phase == PhaseCheckpoint && p.State == spec.StateTraining && len(p.Gang) > 0:
			if h.waitCheckpointWrite(ctx, p.Run) {
				return h.progress(ctx, id), phase
			}
			return h.progress(ctx, id), PhaseEpoch
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h.progress(ctx, id), phase
}

// waitCheckpointWrite polls the run's checkpoint directory for a checkpoint
// being written (objects there, no manifest yet).
func (h *Harness) waitCheckpointWrite(ctx context.Context, run string) bool {
	dir := filepath.Join(h.ckptDir, run)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), "ckpt-") {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, e.Name(), "MANIFEST.json")); errors.Is(err, os.ErrNotExist) {
				return true
			}
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// hostOf is the supervised process of the worker a rank runs on.
// gangAlive says whether every host of the run's gang is running.
func (h *Harness) gangAlive(p *spec.Progress) bool {
	for rank := range p.Gang {
		if w := h.hostOf(p, rank); w == nil || !w.alive() {
			return false
		}
	}
	return true
}

func (h *Harness) hostOf(p *spec.Progress, rank int) *proc {
	if p == nil || rank >= len(p.Gang) {
		return nil
	}
	for _, w := range h.hosts {
		if w.name == p.Gang[rank].Worker {
			return w
		}
	}
	return nil
}
