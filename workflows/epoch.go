package workflows

import (
	"fmt"
	"net"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// runEpoch runs one RunEpoch per host on the host's own worker, in
// parallel. The first failure of a host, or the loss of a hold's lease,
// cancels the rest; what the hosts had already reported still counts
// (mergeEpoch).
func (r *run) runEpoch(ctx workflow.Context, epoch int) epochOutcome {
	g := r.gang
	epochCtx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	world := g.world(r.spec)
	checkpoint := checkpointAfter(r.spec, epoch, r.p.Epochs, world)
	batch := rankBatch(r.spec, world)
	resume := r.p.Attempts > 0
	r.p.Attempts++
	small := smallAllReduceBytes(g.placements)
	links := ringLinks(r.spec, g.placements, small)
	windows := hostWindows(r.spec, g.placements)
	futures := make([]workflow.Future, len(g.placements))
	for host, pl := range g.placements {
		actx := workflow.WithActivityOptions(epochCtx, workflow.ActivityOptions{
			TaskQueue:           pl.HostQueue,
			StartToCloseTimeout: 7 * 24 * time.Hour,
			HeartbeatTimeout:    time.Duration(r.spec.Failure.HeartbeatTimeout),
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		hosts, self := spec.RingHosts(g.placements, host, links)
		in := spec.EpochInput{
			Run: r.p.Run, Generation: g.generation, Rank: pl.Rank, World: world, Hosts: hosts, Host: self, Secret: g.secret, Owner: r.owner,
			Epoch: epoch, Spec: r.ringSpec(), Restore: r.p.Latest, Resume: resume, Checkpoint: checkpoint,
			Slot: pl.Slot, BatchSize: batch, SmallAllReduceBytes: small,
			GatherLinks: links != spec.RingOnly, HostWindows: windows,
		}
		if !r.rankKeys { // the shared secret authenticates: no keys in placements
			for i := range in.Hosts {
				in.Hosts[i].PublicKey, in.Hosts[i].Grant = nil, nil
			}
		}
		futures[host] = workflow.ExecuteActivity(actx, spec.ActivityRunEpoch, in)
	}
	ranks := make([]rankEnd, len(futures))
	settled := make([]bool, len(futures))
	var leftWith []*spec.CheckpointRef // checkpoints the slots of a stopping worker reported
	done := 0
	var first error
	sel := workflow.NewSelector(ctx)
	for rank, f := range futures {
		ranks[rank].where = where(g.placements[rank], r.spec)
		sel.AddFuture(f, func(f workflow.Future) {
			done++
			settled[rank] = true
			if ranks[rank].err = f.Get(ctx, &ranks[rank].result); ranks[rank].err != nil && first == nil {
				first = &rankError{what: ranks[rank].where, err: ranks[rank].err}
			}
		})
	}
	holdEnded := make([]bool, len(g.holds))
	for i, h := range g.holds {
		sel.AddFuture(h, func(f workflow.Future) {
			err := f.Get(ctx, nil)
			holdEnded[i] = true
			if first == nil {
				first = &rankError{what: "lost the slot of " + where(g.placements[i], r.spec), err: leaseErr(err)}
			}
			leftWith = append(leftWith, checkpointIn(err))
		})
	}
	for done < len(futures) && first == nil {
		sel.Select(ctx)
	}
	heardBefore := slices.Clone(settled) // what the epoch's outcome is made of (below)
	if first != nil && r.reuseHolds {
		// The hosts that survive a broken gang say so within moments (the
		// collective's abort reaches every rank at once): wait for those not
		// blamed, briefly, so that the next gang can keep them.
		perHost := max(1, r.spec.Scaling.WorkersPerHost)
		timerCtx, cancelTimer := workflow.WithCancel(ctx)
		graceOver := false
		sel.AddFuture(workflow.NewTimer(timerCtx, survivorGrace), func(workflow.Future) { graceOver = true })
		for !graceOver && awaitingSurvivors(ranks, settled, holdEnded, g.placements, perHost) {
			sel.Select(ctx)
		}
		cancelTimer()
	}
	if first != nil {
		// Cancelled activities settle at once; those that finished keep their results.
		cancel()
		for rank, f := range futures {
			if !settled[rank] {
				ranks[rank].err = f.Get(ctx, &ranks[rank].result)
			}
		}
	}
	// The wait for survivors only tells which hosts to keep: a rank that
	// ended in it (a program failing because its peer was killed, say)
	// counts as cancelled, as it would have been without the wait, so
	// that its error never becomes the epoch's (a user error would end the run).
	merged := slices.Clone(ranks)
	for i := range merged {
		if !heardBefore[i] && settled[i] && merged[i].err != nil {
			merged[i].err = temporal.NewCanceledError("cancelled: the gang had broken")
		}
	}
	out := mergeEpoch(merged, first, leftWith)
	if out.err != nil {
		out.stalled, out.heard = stallOf(ranks)
	}
	if out.err != nil && r.reuseHolds {
		out.survivors = survivors(ranks, settled, holdEnded, g.placements, max(1, r.spec.Scaling.WorkersPerHost))
	}
	return out
}

// survivorGrace bounds how long a broken gang's run waits for its hosts
// that are not blamed to report that they survived.
const survivorGrace = time.Second

// publishEpoch publishes the progress after an epoch (before the
// publish-progress version, the memo alone).
func (r *run) publishEpoch(ctx workflow.Context) {
	if publishesProgress(ctx) {
		r.publish(ctx)
		return
	}
	workflow.UpsertMemo(ctx, memo(r.p))
}

// record counts a finished epoch and tells the run's search, if it is a trial.
func (r *run) record(ctx workflow.Context, res spec.EpochResult) {
	if res.Finished {
		// The ranks' programs ended their training before this epoch: the
		// run has no more epochs to train.
		r.p.Epochs = min(r.p.Epochs, res.Metrics.Epoch)
		// A gang restored past the epochs this run counted (a PBT segment
		// resumed from a donor whose program had finished) is there too:
		// without it the loop would ask the finished program for an epoch
		// again, and wait on it for ever.
		if workflow.GetVersion(ctx, "finished-where-restored", workflow.DefaultVersion, 1) >= 1 {
			r.p.Epoch = max(r.p.Epoch, res.Metrics.Epoch)
		}
		r.publishEpoch(ctx)
		return
	}
	r.p.AddMetrics(res.Metrics)
	r.report(ctx, res.Metrics)
	// The ranks train the epoch their state is at: after a failure that is the
	// latest checkpoint's, which may be behind the epochs counted so far.
	r.p.Epoch = res.Metrics.Epoch + 1
	r.p.Latest = newer(r.p.Latest, res.Checkpoint)
	if res.Restored != nil {
		r.restored(r.p.Generation, res.Metrics.Epoch, *res.Restored)
	}
	r.publishEpoch(ctx)
	// A trial of a search reports to it (fire and forget: a search that has
	// ended has nothing to decide).
	if parent := workflow.GetInfo(ctx).ParentWorkflowExecution; parent != nil {
		workflow.SignalExternalWorkflow(ctx, parent.ID, "", spec.SignalTrialReport,
			spec.TrialReport{WorkflowID: workflow.GetInfo(ctx).WorkflowExecution.ID, Metrics: res.Metrics, Checkpoint: r.p.Latest})
	}
}

// restored records where generation gen's state came from, once: rank 0
// reports it as soon as the gang agreed (SignalGangRestored), and the
// gang's first epoch result reports it again.
func (r *run) restored(gen, epoch int, rr spec.RestoreReport) {
	for _, s := range rr.Skipped {
		r.skipped(gen, epoch, s)
	}
	for _, inc := range r.p.Incidents {
		if inc.Kind == spec.IncidentRestored && inc.Generation == gen {
			return
		}
	}
	r.p.AddIncident(spec.Incident{Generation: gen, Epoch: epoch, Kind: spec.IncidentRestored, Detail: restoredDetail(rr), Restore: &rr})
}

// restoredDetail says where a new gang's state came from and what it cost.
func restoredDetail(rr spec.RestoreReport) string {
	var d string
	if p := rr.Peer; p != nil {
		d = fmt.Sprintf("from a survivor's memory (rank %d of the new gang) at epoch %d step %d, %d bytes over the collective; nothing read from storage", p.Rank, p.Epoch, p.Step, p.Bytes)
	} else {
		d = fmt.Sprintf("from checkpoint %s/%s at epoch %d step %d, %d bytes read from storage", rr.From.Run, rr.From.ID, rr.From.Epoch, rr.From.Step, rr.Bytes)
	}
	if s := rr.SurvivorsAt; s != nil {
		d += fmt.Sprintf("; the gang before had reached epoch %d step %d", s.Epoch, s.Step)
	}
	return d
}

// skipped records a checkpoint a restore passed over as damaged, once per gang.
func (r *run) skipped(gen, epoch int, s spec.SkippedCheckpoint) {
	if inc := skippedIncident(r.p.Incidents, gen, epoch, s); inc != nil {
		r.p.AddIncident(*inc)
	}
}

// saveCheckpoint has rank 0 checkpoint its warm replica now (a stop between epochs).
func (r *run) saveCheckpoint(ctx workflow.Context) error {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           r.gang.placements[0].HostQueue,
		StartToCloseTimeout: time.Hour,
		HeartbeatTimeout:    time.Duration(r.spec.Failure.HeartbeatTimeout),
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var ref spec.CheckpointRef
	in := spec.SaveCheckpointInput{Run: r.p.Run, Generation: r.gang.generation, Spec: r.spec}
	if m, ok := r.p.LastMetrics(); ok {
		in.Metrics = m
	}
	if err := workflow.ExecuteActivity(actx, spec.ActivitySaveCheckpoint, in).Get(ctx, &ref); err != nil {
		return err
	}
	r.p.Latest = &ref
	return nil
}

// smallAllReduce is the largest all-reduce, per rank, that a gang gathers
// instead of running the ring (the same sums in fewer steps): at 4 KiB the
// gather took about half the ring's time, at 64 KiB with 2 ranks several
// times more (BENCHMARKS.md).
const smallAllReduce = 4 << 10

// smallAllReduceBytes is EpochInput.SmallAllReduceBytes for a gang: the
// small all-reduce if every host's worker can gather, else 0 (a worker of
// an earlier release in the gang runs the ring only, and ranks must agree).
func smallAllReduceBytes(placements []spec.Placement) int {
	for _, p := range placements {
		if !p.SmallAllReduce {
			return 0
		}
	}
	return smallAllReduce
}

// hostWindows says whether a gang reduces through host windows
// (EpochInput.HostWindows): where every placement's worker can (ranks must
// agree), each holds one rank (a hierarchical run reduces within a host in
// its own memory), and all are on one machine. Elsewhere the collective
// would find it cannot map every window and run its ring anyway, after an
// exchange at every join.
func hostWindows(s spec.Training, placements []spec.Placement) bool {
	if len(placements) < 2 || (s.Scaling.Hierarchical() && placements[0].LocalRanks() > 1) {
		return false
	}
	machine := ""
	for i, p := range placements {
		if !p.HostWindows {
			return false
		}
		host, _, err := net.SplitHostPort(p.Collective)
		if err != nil {
			return false
		}
		if i > 0 && host != machine {
			return false
		}
		machine = host
	}
	return true
}

// ringLinks says whether a gang's small all-reduces gather over skip links
// (EpochInput.GatherLinks), and so which placements each host's input
// names: where every host's worker can (ranks must agree), the ring has 3
// members or more (ranks, or hosts in a hierarchical run), and the hosts
// are on more than one machine (on one, the ring is shared memory all
// round, where a step costs microseconds and a link would be loopback TCP).
// small is the gang's smallAllReduceBytes.
func ringLinks(s spec.Training, placements []spec.Placement, small int) spec.RingLinks {
	if small == 0 {
		return spec.RingOnly
	}
	machines := map[string]bool{}
	for _, p := range placements {
		if !p.GatherLinks {
			return spec.RingOnly
		}
		host, _, err := net.SplitHostPort(p.Collective)
		if err != nil {
			host = p.Collective
		}
		machines[host] = true
	}
	if len(machines) < 2 {
		return spec.RingOnly
	}
	links, members := spec.RankSkipLinks, len(placements)*placements[0].LocalRanks()
	if s.Scaling.Hierarchical() && placements[0].LocalRanks() > 1 {
		links, members = spec.HostSkipLinks, len(placements)
	}
	if members < 3 {
		return spec.RingOnly
	}
	return links
}
