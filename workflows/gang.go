package workflows

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// gang is a reserved set of hosts, each a set of slots on one worker (one
// per rank, scaling.workers_per_host of them) held by one HoldSlot activity.
type gang struct {
	generation int
	placements []spec.Placement // one per host, by host; Rank is the host's first rank
	holdIDs    []holdID         // what each host's hold was asked as, by host
	holds      []workflow.Future
	cancels    []workflow.CancelFunc // each host's hold on its own, by host; nil where the holds share one context
	release    workflow.CancelFunc
	secret     []byte // runs before per-rank keys only (run.rankKeys)
}

// survivingHosts are the hosts of a broken gang that the run keeps for its
// next one (run.reuseHolds): their ranks ended only because another host's
// rank failed, and their holds are still good. The next gang asks only for
// the hosts it lacks, and its ranks on these hosts find the state they kept
// (failure.recover_from_peers): a gang without a spare slot forms as soon as
// the lost host's replacement grants its hold.
type survivingHosts struct {
	placements []spec.Placement
	holdIDs    []holdID
	holds      []workflow.Future
	cancels    []workflow.CancelFunc
}

// held is the surviving hosts, as run runID holds them.
func (s *survivingHosts) held(runID string) []heldHost {
	hosts := make([]heldHost, len(s.placements))
	for i, pl := range s.placements {
		hosts[i] = heldHost{hold: s.holdIDs[i], queue: pl.HostQueue, runs: []string{runID}}
	}
	return hosts
}

// release cancels the surviving hosts' holds.
func (s *survivingHosts) release() {
	for _, c := range s.cancels {
		c()
	}
}

var errStopped = errors.New("stopped while forming a gang")

// preemptedWhileForming is a granted slot whose worker began stopping before
// the rest of its gang was granted.
type preemptedWhileForming struct{ err error }

func (e *preemptedWhileForming) Error() string { return e.err.Error() }
func (e *preemptedWhileForming) Unwrap() error { return e.err }

// formGang reserves every slot at once or none: on timeout it releases what it
// holds and backs off with jitter, so that runs competing for too few slots
// take turns instead of each holding part of a gang.
func (r *run) formGang(ctx workflow.Context) error {
	start := workflow.Now(ctx)
	for attempt := 0; ; attempt++ {
		r.p.Generation++
		gen := r.p.Generation
		g, err := r.reserve(ctx, gen)
		if err == nil {
			r.waiting(ctx, "")
			workflow.GetMetricsHandler(ctx).Timer(metricname.GangFormationLatency).Record(workflow.Now(ctx).Sub(start))
			r.gang = g
			r.p.Gang, r.p.World = g.placements, g.world(r.spec)
			if n := g.world(r.spec); n < r.spec.Scaling.Workers {
				r.p.AddIncident(spec.Incident{Generation: gen, Epoch: r.p.Epoch, Kind: spec.IncidentResized,
					Detail: fmt.Sprintf("only %d of %d slots within scaling.gang_timeout: going on with %d ranks (scaling.min_workers %d), global batch kept", n, r.spec.Scaling.Workers, n, r.spec.Scaling.MinWorkers)})
			}
			return nil
		}
		if errors.Is(err, errStopped) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err() // cancelled: every hold was cancelled with it
		}
		// A worker told to stop while its slot waited for the rest of the
		// gang is a preemption, as it is mid-epoch: counted against
		// failure.max_preemptions, and the next gang is asked for at once
		// (nothing was contended). Runs recorded before counted it as a
		// gang that did not form.
		var preempted *preemptedWhileForming
		if errors.As(err, &preempted) && workflow.GetVersion(ctx, "preempted-while-forming", workflow.DefaultVersion, 1) >= 1 {
			inc, err := charge(r.p, r.spec.Failure, r.p.Epoch, preempted.err)
			r.p.AddIncident(*inc)
			if err != nil {
				return err
			}
			continue
		}
		r.p.AddIncident(spec.Incident{Generation: gen, Epoch: r.p.Epoch, Kind: spec.IncidentGangTimeout, Detail: err.Error()})
		var jitter int64
		workflow.SideEffect(ctx, func(workflow.Context) any { return time.Now().UnixNano() }).Get(&jitter)
		backoff := gangBackoff(attempt, time.Duration(r.spec.Scaling.GangTimeout), jitter)
		r.waiting(ctx, fmt.Sprintf("gang %d did not form (%v); trying again at %s, in %v", gen, err,
			workflow.Now(ctx).Add(backoff).UTC().Format(time.TimeOnly), backoff.Round(time.Second)))
		workflow.GetLogger(ctx).Info("gang not formed; backing off", "generation", gen, "backoff", backoff, "error", err)
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(workflow.NewTimer(ctx, backoff), func(workflow.Future) {})
		sel.AddReceive(r.stop, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil); r.p.Stopping = true })
		sel.Select(ctx)
		if r.p.Stopping {
			return errStopped
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// holdSlots starts one HoldSlot per request (a host: workers_per_host
// slots), each cancellable on its own; cancelling the returned release
// cancels them all.
func (r *run) holdSlots(ctx workflow.Context, gen int, requests []int) ([]workflow.Future, []workflow.CancelFunc, workflow.CancelFunc) {
	a := r.newHoldAsker(ctx, gen)
	holds := make([]workflow.Future, len(requests))
	cancels := make([]workflow.CancelFunc, len(requests))
	for i, req := range requests {
		holds[i], cancels[i] = a.ask(req)
	}
	return holds, cancels, a.release
}

// holdAsker starts a generation's HoldSlot activities, under one release:
// a request's first hold, and the holds asked for it again.
type holdAsker struct {
	r        *run
	ctx      workflow.Context // the holds' context, cancelled by release
	release  workflow.CancelFunc
	gen      int
	attempts map[int]int    // holds asked for so far, by request
	ids      map[int]string // the activity ID of each request's latest hold (hedge-holds)
}

func (r *run) newHoldAsker(ctx workflow.Context, gen int) *holdAsker {
	holdCtx, release := workflow.WithCancel(ctx)
	holdCtx = workflow.WithActivityOptions(holdCtx, workflow.ActivityOptions{
		TaskQueue:              r.spec.Scaling.TaskQueue,
		ScheduleToStartTimeout: time.Duration(r.spec.Scaling.GangTimeout),
		StartToCloseTimeout:    365 * 24 * time.Hour,
		HeartbeatTimeout:       time.Duration(r.spec.Failure.HeartbeatTimeout),
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	return &holdAsker{r: r, ctx: holdCtx, release: release, gen: gen, attempts: map[int]int{}, ids: map[int]string{}}
}

// ask starts a hold for request req: its future, and a cancel of that hold
// alone (elastic runs; before, the holds shared the release only).
func (a *holdAsker) ask(req int) (workflow.Future, workflow.CancelFunc) {
	r := a.r
	c, cancel := a.ctx, workflow.CancelFunc(func() {})
	if r.elastic {
		c, cancel = workflow.WithCancel(a.ctx)
	}
	info := workflow.GetInfo(c)
	in := spec.HoldSlotInput{
		WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID, Generation: a.gen, Request: req, Slots: slotsPerHold(r.spec)}
	if r.keepGang {
		in.KeepFor = r.spec.Scaling.GangTimeout // the next run takes the gang over within its gang timeout
	}
	if r.askAgain {
		in.Attempt = a.attempts[req]
		a.attempts[req]++
	}
	if r.hedgeHolds {
		a.ids[req] = holdActivityID(a.gen, req, in.Attempt)
		opts := workflow.GetActivityOptions(c)
		opts.ActivityID = a.ids[req]
		c = workflow.WithActivityOptions(c, opts)
	}
	return workflow.ExecuteActivity(c, spec.ActivityHoldSlot, in), cancel
}

// reserve starts one HoldSlot per host and waits until each has signalled
// its placement, one of them fails, the gang timeout passes, or a stop
// arrives. At the timeout a gang of at least scaling.min_workers ranks is
// taken.
func (r *run) reserve(ctx workflow.Context, gen int) (*gang, error) {
	workers, perHost := r.spec.Scaling.Hosts(), max(1, r.spec.Scaling.WorkersPerHost)
	// The hosts kept from the gang before are hosts 0..kept-1, granted
	// already; the others are asked for as requests kept..workers-1.
	surv := r.survivors
	r.survivors = nil
	kept := 0
	if surv != nil {
		kept = min(len(surv.placements), workers)
	}
	requests := make([]int, workers-kept)
	for i := range requests {
		requests[i] = kept + i
	}
	asker := r.newHoldAsker(ctx, gen)
	// holds[i] is request i's hold: hosts 0..workers-1 first, then the
	// hedged requests (workers, workers+1, ...), added by hedge.
	holds := make([]workflow.Future, workers)
	cancels := make([]workflow.CancelFunc, workers)
	for _, req := range requests {
		holds[req], cancels[req] = asker.ask(req)
	}
	release := asker.release
	if surv != nil {
		copy(holds, surv.holds[:kept])
		copy(cancels, surv.cancels[:kept])
		release = func() { asker.release(); surv.release() }
	}
	var secret []byte
	if !r.rankKeys {
		workflow.SideEffect(ctx, func(workflow.Context) any { return newSecret() }).Get(&secret)
	}

	placements := make([]spec.Placement, workers)
	granted := make([]bool, workers)
	ended := make([]bool, workers) // a hold that ended before it was granted: no slot came
	asked := make([]int, workers)  // holds asked for again after a worker had too few slots
	holdIDs := make([]holdID, workers)
	for i := range workers {
		holdIDs[i] = holdID{gen, i}
	}
	for i := range kept {
		granted[i], placements[i], holdIDs[i] = true, surv.placements[i], surv.holdIDs[i]
	}
	// hedge asks for one more host per hold that a worker started but has
	// not granted (hedge.go). A hedge that ends without a grant is not
	// asked for again.
	hedge := func() {
		var waiting []string
		for i := range holds {
			if !granted[i] && !ended[i] {
				waiting = append(waiting, asker.ids[i])
			}
		}
		for range r.holdsToHedge(ctx, waiting) {
			req := len(holds)
			h, c := asker.ask(req)
			holds, cancels = append(holds, h), append(cancels, c)
			placements, granted, ended, asked = append(placements, spec.Placement{}), append(granted, false), append(ended, false), append(asked, 0)
			holdIDs = append(holdIDs, holdID{gen, req})
		}
	}
	var goneErr error // why the last ungranted hold ended
	const maxAsks = 8
	timedOut := false
	var holdErr error
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	timer := workflow.NewTimer(timerCtx, time.Duration(r.spec.Scaling.GangTimeout))
	var hedgeTimer workflow.Future
	if r.hedgeHolds && r.elastic && kept < workers {
		hedgeTimer = workflow.NewTimer(timerCtx, hedgeAfter(r.spec))
	}
	count, gone, hedgesGone := kept, 0, 0
	deadline := workflow.Now(ctx).Add(time.Duration(r.spec.Scaling.GangTimeout)).UTC().Format(time.TimeOnly)
	say := func() {
		what := "slots"
		if perHost > 1 {
			what = fmt.Sprintf("hosts of %d slots", perHost)
		}
		r.waiting(ctx, fmt.Sprintf("gang %d: %d of %d %s granted on task queue %q; waiting until %s (scaling.gang_timeout %v)",
			gen, count, workers, what, r.spec.Scaling.TaskQueue, deadline, r.spec.Scaling.GangTimeout))
	}
	say()
	for count < workers && count+gone+hedgesGone < len(holds) && !timedOut && holdErr == nil && !r.p.Stopping {
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(r.grants, func(c workflow.ReceiveChannel, _ bool) {
			s, _ := r.takeGrant(ctx, c)
			if s == nil {
				return
			}
			if s.Generation != gen || s.Request < 0 || s.Request >= len(holds) || granted[s.Request] || ended[s.Request] ||
				r.askAgain && s.Attempt != asked[s.Request] {
				return // a slot of an older gang, a duplicate, or the late grant of a hold lost and asked for again
			}
			granted[s.Request] = true
			placements[s.Request] = s.Placement
			count++
			say()
		})
		sel.AddFuture(timer, func(workflow.Future) { timedOut = true })
		if hedgeTimer != nil {
			sel.AddFuture(hedgeTimer, func(workflow.Future) { hedgeTimer = nil; hedge() })
		}
		sel.AddReceive(r.stop, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil); r.p.Stopping = true })
		for i, h := range holds {
			if ended[i] {
				continue
			}
			sel.AddFuture(h, func(f workflow.Future) {
				err := f.Get(ctx, nil)
				ended[i] = true
				switch {
				case granted[i] && errorType(err) == spec.ErrPreempted:
					holdErr = &preemptedWhileForming{&rankError{what: "the slot of " + where(placements[i], r.spec) + " was preempted before the gang formed", err: err}}
				case granted[i]:
					holdErr = fmt.Errorf("the slot of %s ended before the gang formed: %v", where(placements[i], r.spec), leaseErr(err))
				case i >= workers:
					hedgesGone++ // a hedge no free slot took at once
				case asked[i] < maxAsks && (r.hostHolds && errorType(err) == spec.ErrNoSlot || r.askAgain && askAgainAfter(err)):
					// A worker took the hold with too few slots free (it
					// polled before another hold filled it), or took it and
					// lost it (its heartbeat timed out): ask again. A hold
					// asked again has a new future and, elastic, a new cancel.
					asked[i]++
					holds[i], cancels[i] = asker.ask(i)
					ended[i] = false
				default:
					gone++
					goneErr = err
				}
			})
		}
		sel.Select(ctx)
	}
	// The hosts that granted a hold, for letting go of them at once.
	grantedHosts := func() []heldHost {
		var hosts []heldHost
		runID := workflow.GetInfo(ctx).WorkflowExecution.RunID
		for i := range holds {
			if granted[i] {
				hosts = append(hosts, heldHost{hold: holdIDs[i], queue: placements[i].HostQueue, runs: []string{runID}})
			}
		}
		return hosts
	}
	if r.p.Stopping {
		release()
		r.letGo(ctx, grantedHosts(), true) // the run is about to close
		return nil, errStopped
	}
	if holdErr != nil {
		release()
		r.letGo(ctx, grantedHosts(), false)
		return nil, holdErr
	}
	if count < workers && count*perHost < r.spec.Scaling.MinWorkers {
		release()
		r.letGo(ctx, grantedHosts(), false) // a partial gang: other runs may use its slots while this one backs off
		why := ""
		if goneErr != nil {
			why = fmt.Sprintf("; %d asked for ended without a slot, the last because: %s", gone, shortError(goneErr))
		}
		if perHost > 1 {
			return nil, fmt.Errorf("only %d of %d hosts of %d slots on task queue %q within scaling.gang_timeout %v%s", count, workers, perHost, r.spec.Scaling.TaskQueue, r.spec.Scaling.GangTimeout, why)
		}
		return nil, fmt.Errorf("only %d of %d slots on task queue %q within scaling.gang_timeout %v%s", count, workers, r.spec.Scaling.TaskQueue, r.spec.Scaling.GangTimeout, why)
	}
	// The whole gang, or at least min_workers of it: the ungranted holds go.
	g := &gang{generation: gen, release: release, secret: secret}
	for i := range holds {
		if granted[i] {
			g.placements = append(g.placements, placements[i])
			g.holdIDs = append(g.holdIDs, holdIDs[i])
			g.holds = append(g.holds, holds[i])
			g.cancels = append(g.cancels, cancels[i])
		} else {
			cancels[i]()
		}
	}
	for i := range g.placements {
		g.placements[i].Rank = i * perHost
	}
	return g, nil
}

// world is the gang's ranks.
func (g *gang) world(s spec.Training) int {
	return len(g.placements) * max(1, s.Scaling.WorkersPerHost)
}

// slotsPerHold is what each HoldSlot asks for: 0 (one slot, as runs before
// hosts asked) or scaling.workers_per_host.
func slotsPerHold(s spec.Training) int {
	if s.Scaling.WorkersPerHost > 1 {
		return s.Scaling.WorkersPerHost
	}
	return 0
}

// waiting says what the run waits for (empty: nothing), in the progress
// query and the Temporal UI's details.
func (r *run) waiting(ctx workflow.Context, what string) {
	if r.p.Waiting == what {
		return
	}
	r.p.Waiting = what
	workflow.SetCurrentDetails(ctx, details(r.p))
}

// releaseGang gives up the gang and any probe: it cancels their holds and
// lets go of every host that granted one (release.go); with wait, for a run
// about to close, until the hosts answered.
func (r *run) releaseGang(ctx workflow.Context, wait bool) {
	var hosts []heldHost
	runID := workflow.GetInfo(ctx).WorkflowExecution.RunID
	if r.probe != nil {
		hosts = append(hosts, r.probe.held(runID)...)
		r.probe.release()
		r.probe = nil
	}
	if r.gang != nil {
		hosts = append(hosts, r.gang.held(runID)...)
		r.gang.release()
		r.gang = nil
		r.p.Gang = nil
		r.p.World = 0
	}
	if r.survivors != nil {
		hosts = append(hosts, r.survivors.held(runID)...)
		r.survivors.release()
		r.survivors = nil
	}
	r.letGo(ctx, hosts, wait)
}

// breakGang gives up a gang that broke but keeps its surviving hosts
// (survivors: host indices) for the next one, where the run can: it lets
// go of the other hosts and any probe at once.
func (r *run) breakGang(ctx workflow.Context, survivors []int) {
	g := r.gang
	if !r.reuseHolds || g == nil || len(survivors) == 0 || len(g.cancels) != len(g.placements) || len(g.holdIDs) != len(g.placements) {
		r.releaseGang(ctx, false)
		return
	}
	runID := workflow.GetInfo(ctx).WorkflowExecution.RunID
	var hosts []heldHost
	if r.probe != nil {
		hosts = append(hosts, r.probe.held(runID)...)
		r.probe.release()
		r.probe = nil
	}
	s := &survivingHosts{}
	for i, pl := range g.placements {
		if slices.Contains(survivors, i) {
			s.placements = append(s.placements, pl)
			s.holdIDs = append(s.holdIDs, g.holdIDs[i])
			s.holds = append(s.holds, g.holds[i])
			s.cancels = append(s.cancels, g.cancels[i])
			continue
		}
		hosts = append(hosts, heldHost{hold: g.holdIDs[i], queue: pl.HostQueue, runs: []string{runID}})
		g.cancels[i]()
	}
	r.survivors = s
	r.gang, r.p.Gang, r.p.World = nil, nil, 0
	r.letGo(ctx, hosts, false)
}
