package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// recoveryLimit bounds how long a fault may take to recover from before the
// harness moves on (and reports it as not recovered).
const recoveryLimit = 90 * time.Second

// restartWait bounds how long a fault waits for its target's restart.
const restartWait = 30 * time.Second

// inject waits for the phase, injects one fault of the kind, and measures
// how long the run takes to count it and to train again.
func (h *Harness) inject(ctx context.Context, id, kind, phase string) Fault {
	p, phase := h.waitPhase(ctx, id, phase)
	f := Fault{Run: id, Kind: kind, Phase: phase}
	if p == nil || p.State == spec.StateCompleted || p.State == spec.StateFailed {
		f.Note, f.tooLate = "the run ended before the fault could land", true
		return f
	}
	if kind == Corrupt {
		// There must be a committed checkpoint to corrupt, and one before it.
		deadline := time.Now().Add(time.Minute)
		for h.committed(p.Run) < 2 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		p = h.progress(ctx, id)
		if p == nil || len(p.Gang) == 0 || p.State != spec.StateTraining {
			f.Note = "no gang training to strike"
			return f
		}
	}
	rank := h.rng.IntN(max(1, len(p.Gang)))
	if kind == Corrupt {
		rank = 0
	}
	target := h.hostOf(p, rank)
	if target == nil && phase == PhaseGang {
		// The gang's placements are not known until it has formed: strike any host.
		target = h.hosts[h.rng.IntN(len(h.hosts))]
	}
	// A fault strikes a running process. A host killed by the fault before
	// may still be down, waiting for its restart, while the run has not yet
	// counted its loss: wait for it to come back, then look at the run again,
	// so that the loss before is not taken for this fault's.
	for deadline := time.Now().Add(restartWait); target != nil && kind != Server && !target.alive() && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(20 * time.Millisecond)
		if target.alive() {
			if q := h.progress(ctx, id); q != nil {
				p = q
			}
		}
	}
	before, gen, epoch, incidents := p.Failures+p.Preemptions, p.Generation, p.Epoch, troubles(p)
	f.gen = gen
	if target == nil && kind != Server {
		f.Note = "no gang to strike"
		return f
	}
	if target != nil {
		f.Target = target.name
	}
	var heal func()
	start := time.Now()
	f.at = start
	var err error
	switch kind {
	case Kill:
		_, err = target.signal(syscall.SIGKILL)
	case Term:
		_, err = target.signal(syscall.SIGTERM)
	case Stop:
		if _, err = target.signal(syscall.SIGSTOP); err == nil {
			heal = func() { target.signal(syscall.SIGCONT) }
		}
	case Partition:
		i := h.hostIndex(target)
		if err = h.net.partition(i, true); err == nil {
			heal = func() { h.net.partition(i, false) }
		}
	case Server:
		f.Target = "devserver"
		h.server.setStopping(true)
		var exited <-chan struct{}
		if exited, err = h.server.signal(syscall.SIGKILL); err == nil {
			<-exited
			time.Sleep(time.Duration(1000+h.rng.IntN(2000)) * time.Millisecond)
			h.server.setStopping(false)
			err = h.server.start()
		}
	case Corrupt:
		var which string
		if which, err = h.corruptLatest(p.Run); err == nil {
			f.Note = "corrupted " + which + "; "
			_, err = target.signal(syscall.SIGKILL)
		}
	default:
		err = fmt.Errorf("unknown fault kind %q", kind)
	}
	if err != nil {
		f.Note += "injection failed: " + err.Error()
		if heal != nil {
			heal()
		}
		return f
	}

	answering := time.Duration(0)
	formed := time.Duration(0) // when a gang with the struck host in it began training (PhaseGang)
	for time.Since(start) < recoveryLimit && ctx.Err() == nil {
		q := h.progress(ctx, id)
		if q == nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if answering == 0 {
			answering = time.Since(start)
		}
		if q.State == spec.StateCompleted {
			f.OK, f.Note = true, f.Note+"the run completed first"
			break
		}
		if kind == Server {
			if q.Epoch > epoch || q.Generation > gen && q.State == spec.StateTraining {
				f.Resumed, f.OK = time.Since(start), true
				f.Note += fmt.Sprintf("server answering again after %v", answering.Round(time.Millisecond))
				break
			}
		} else {
			if f.Detected == 0 && (q.Failures+q.Preemptions > before || phase == PhaseGang && troubles(q) > incidents) {
				f.Detected = time.Since(start)
				if heal != nil && h.cfg.Hosts <= h.cfg.Ranks {
					// No spare host: the next gang needs the struck one, which
					// comes back once its fault is noticed, as a restarted one does.
					heal()
					heal = nil
				}
			}
			if phase == PhaseGang && q.State == spec.StateTraining && len(q.Gang) > 0 && f.Detected == 0 && target != nil && inGang(q.Gang, target.name) {
				// The gang formed with the struck host in it. Its rank may not
				// have joined the gang's collective, and then its loss shows
				// only at its hold's heartbeat timeout: wait that long for it,
				// or the next fault is charged with it. (A host restarted in
				// time to join the gang is in it too, and costs nothing.)
				if formed == 0 {
					formed = time.Since(start)
				}
				if time.Since(start)-formed < h.cfg.HeartbeatLimit+time.Second {
					time.Sleep(10 * time.Millisecond)
					continue
				}
			}
			if phase == PhaseGang && q.State == spec.StateTraining && len(q.Gang) > 0 {
				// Struck while the gang formed: whether or not it cost a gang, training began.
				f.Resumed, f.OK = time.Since(start), true
				if formed > 0 && f.Detected == 0 {
					f.Resumed = formed
				}
				if f.Detected == 0 {
					f.Note += "the struck host held no slot of the forming gang"
				}
				break
			}
			if f.Detected > 0 && q.State == spec.StateTraining && q.Generation > gen && len(q.Gang) > 0 {
				f.Resumed, f.OK = time.Since(start), true
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !f.OK && f.Note == "" {
		f.Note = fmt.Sprintf("not recovered within %v", recoveryLimit)
	}
	if heal != nil {
		heal()
	}
	return f
}

// troubles counts the run's incidents but its restores: a gang's restore
// is recorded when its first epoch ends, which may be after the next
// fault struck, and is not that fault's doing.
func troubles(p *spec.Progress) int {
	n := 0
	for _, inc := range p.Incidents {
		if inc.Kind != spec.IncidentRestored {
			n++
		}
	}
	return n
}

func (h *Harness) hostIndex(p *proc) int {
	for i, w := range h.hosts {
		if w == p {
			return i
		}
	}
	return -1
}

// committed counts the run's committed checkpoints.
func (h *Harness) committed(run string) int {
	n := 0
	entries, _ := os.ReadDir(filepath.Join(h.ckptDir, run))
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(h.ckptDir, run, e.Name(), "MANIFEST.json")); err == nil {
			n++
		}
	}
	return n
}

// corruptLatest truncates the state object of the run's newest committed
// checkpoint to half its size: the kind of damage a crash mid-copy leaves.
func (h *Harness) corruptLatest(run string) (string, error) {
	dir := filepath.Join(h.ckptDir, run)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var committed []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "MANIFEST.json")); err == nil && strings.HasPrefix(e.Name(), "ckpt-") {
			committed = append(committed, e.Name())
		}
	}
	if len(committed) == 0 {
		return "", fmt.Errorf("run %s has no committed checkpoint yet", run)
	}
	sort.Strings(committed)
	latest := committed[len(committed)-1]
	objects, _ := os.ReadDir(filepath.Join(dir, latest))
	for _, o := range objects {
		if o.Name() == "MANIFEST.json" || strings.HasSuffix(o.Name(), ".attrs") {
			continue
		}
		path := filepath.Join(dir, latest, o.Name())
		st, err := os.Stat(path)
		if err != nil {
			return "", err
		}
		return latest, os.Truncate(path, st.Size()/2)
	}
	return "", fmt.Errorf("checkpoint %s has no objects", latest)
}

// inGang reports whether the worker named name holds a slot of the gang.
func inGang(gang []spec.Placement, name string) bool {
	return slices.ContainsFunc(gang, func(pl spec.Placement) bool { return pl.Worker == name })
}
