package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// trialSuffix names a search's trials after it (up to 5 digits: MaxTrials is 10,000).
const trialSuffix = "%s-trial-%03d"

// A search continues as new before its history grows too long (every
// trial's start, end and reports are events; Temporal caps a history at
// 51,200). Trials are child workflows, and a parent's close policy applies
// at continue-as-new: the search stops starting trials, lets the running
// ones finish (draining), and continues with what it carries (tuneCarried).
const (
	TuneContinueAsNewAfterEvents  = 10000
	TuneContinueAsNewAfterSignals = 5000
)

// tuneCarried is what a search carries through continue-as-new, beside its spec.
type tuneCarried struct {
	Results   *spec.TuneResults `json:"results"`
	Scheduler json.RawMessage   `json:"scheduler,omitempty"`
	Searcher  json.RawMessage   `json:"searcher,omitempty"`
	// Segments are PBT continuations cloned but not started when the
	// search drained: the next execution starts them first.
	Segments []pendingSegment `json:"segments,omitempty"`
	// ResetTag sets apart the trials' workflow IDs and run names of a
	// search that was reset (TuneWorkflow says why); empty if never reset.
	ResetTag string `json:"reset_tag,omitempty"`
}

// exploitPlan is a trial PBT told to stop at a perturbation point: to
// exploit another (From is cloned, and it continues with Config), or, in a
// time-shared population, to pause (it continues later from its own
// checkpoint, when a slot is free and it has trained least).
type exploitPlan struct {
	Donor  int
	From   spec.CheckpointRef
	Config map[string]json.RawMessage
	Epoch  int
	Pause  bool
	// A time-shared search clones as it decides, while the trial stops
	// (the donor trains on, and prunes its checkpoints): the segment starts
	// once both are done; abandoned if the trial ended otherwise.
	cloned    *spec.CloneCheckpointResult
	cloneErr  error
	cloneDone bool
	childDone bool
	abandoned bool
}

// pendingSegment is a trial's next segment: its config and the run it
// resumes from, and the epochs trained by then (the least trained starts first).
type pendingSegment struct {
	Trial      int                        `json:"trial"`
	Config     map[string]json.RawMessage `json:"config"`
	ResumeFrom string                     `json:"resume_from"`
	Epochs     int                        `json:"epochs,omitempty"`
}

// TuneWorkflow runs a hyperparameter search: each trial is a child
// TrainingWorkflow with its own gang; trials report every epoch; the
// scheduler (FIFO, ASHA, median stopping) and the stop criteria stop trials
// early through the trial's stop signal, so they end gracefully and keep
// their checkpoints. Its input is the JSON of tune.Spec.
//
// A search of more than spec.MaxListedTrials trials keeps only that many
// rows: its finished rows move to blob storage in parts (WriteTuneRows),
// and the results CSV merges them back.
func TuneWorkflow(ctx workflow.Context, input converter.RawValue) (*spec.TuneResults, error) {
	r, err := newSearch(ctx, input)
	if err != nil {
		return nil, err
	}
	if err := workflow.SetQueryHandler(ctx, spec.QueryResults, func() (*spec.TuneResults, error) { return r.res, nil }); err != nil {
		return nil, err
	}
	if r.carried != nil {
		for _, seg := range r.carried.Segments {
			switch {
			case seg.Trial < 0 || seg.Trial >= len(r.trials) || r.res.Row(seg.Trial) == nil:
			case r.timeShared:
				r.ready = append(r.ready, seg)
			default:
				r.startSegment(seg)
			}
		}
	}
	r.fill()
	r.sel.AddReceive(workflow.GetSignalChannel(ctx, spec.SignalTrialReport), func(c workflow.ReceiveChannel, _ bool) {
		var rep spec.TrialReport
		if !c.ReceiveAsync(&rep) {
			return // it did not decode (the SDK logs and drops it): not a report
		}
		r.onReport(rep)
	})
	for len(r.children) > 0 || r.clones > 0 {
		before := r.done
		r.sel.Select(ctx)
		if r.badMetric != nil {
			// Every trial reports the same metrics: none could be ranked. The
			// trials are cancelled as the search closes (REQUEST_CANCEL),
			// keeping their checkpoints.
			return nil, temporal.NewNonRetryableApplicationError("tune spec: "+r.badMetric.Error(), spec.ErrUser, nil)
		}
		if r.bounded {
			if r.done > before { // rows change status only when a trial ends
				moveRows(ctx, r.res, r.url)
			}
			h := workflow.GetInfo(ctx)
			r.draining = r.draining || (r.next < len(r.trials) || r.pbt != nil) && (h.GetCurrentHistoryLength() >= TuneContinueAsNewAfterEvents ||
				r.signals >= TuneContinueAsNewAfterSignals || h.GetContinueAsNewSuggested())
		}
		r.fill()
	}
	if ctx.Err() == nil && (r.next < len(r.trials) || len(r.carry) > 0 || len(r.ready) > 0) {
		return nil, r.continueAsNew()
	}
	return r.close()
}

// search is one execution of a TuneWorkflow: its spec, its trials, the
// scheduler and searcher that decide about them, and its results. Its
// methods run on the workflow's one coroutine, from the selector's callbacks.
type search struct {
	ctx      workflow.Context
	info     *workflow.Info
	raw      json.RawMessage // the input, carried again at continue-as-new
	s        tune.Spec
	carried  *tuneCarried
	trials   []tune.Trial
	searcher tune.Searcher
	sched    tune.Scheduler
	pbt      *tune.PBT
	resetTag string
	owned    bool // trials own their checkpoint run names
	bounded  bool // finished rows move out; the search continues as new
	name     string
	url      string // where the results go
	res      *spec.TuneResults
	sel      workflow.Selector

	segOf       map[string]int                       // running PBT segments' workflow IDs -> trial
	children    map[int]workflow.ChildWorkflowFuture // running trials
	byCriterion map[int]bool                         // stopped by a stop criterion, not the scheduler
	plans       map[int]*exploitPlan                 // PBT: trials told to stop for an exploit
	next, done  int                                  // trials started, trials ended
	signals     int                                  // reports received
	draining    bool                                 // no new trials: the search continues as new
	clones      int                                  // PBT: clone activities in flight
	carry       []pendingSegment                     // PBT: segments for the next execution
	ready       []pendingSegment                     // PBT, time-shared: segments waiting for a slot
	timeShared  bool                                 // PBT: trials give up their slots at perturbation points (pbt-time-share)
	badMetric   error                                // a report without a metric the search needs: the search fails
}

// newSearch decodes the input, expands or prepares the trials, names them
// and sets up the results, fresh or carried across continue-as-new.
func newSearch(ctx workflow.Context, input converter.RawValue) (*search, error) {
	info := workflow.GetInfo(ctx)
	raw, err := inputBytes(input)
	r := &search{ctx: ctx, info: info, raw: raw, segOf: map[string]int{}, children: map[int]workflow.ChildWorkflowFuture{},
		byCriterion: map[int]bool{}, plans: map[int]*exploitPlan{}}
	if err == nil {
		r.s, r.carried, err = decodeTuneInput(raw, info.ContinuedExecutionRunID != "")
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	s := r.s
	// The random searcher's trials are expanded (and validated) ahead; a
	// model-based searcher's config is chosen as each trial starts, from
	// the trials that ended before.
	r.searcher, err = tune.NewSearcher(s.SearchAlg, s.ParamSpace, s.Mode, s.Seed)
	switch {
	case err != nil:
	case r.searcher == nil:
		r.trials, err = tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
	default:
		r.trials = make([]tune.Trial, s.NumSamples)
		for i := range r.trials {
			r.trials[i].Index = i
		}
		_, err = tune.Apply(s.Train, r.searcher.Suggest(0)) // a random draw: the space fits the spec
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError("tune spec: "+err.Error(), spec.ErrUser, nil)
	}
	// A reset search (Temporal's Reset: a new run that replays its base
	// run's history up to the point chosen; the base run is terminated and
	// its trials asked to cancel) starts its trials again as new workflows.
	// The base run's trials may still be closing under their workflow IDs,
	// and own their checkpoint run names (checkpoint.Store.Claim), so a
	// reset run names its trials apart, IDs and run names, with a tag of its
	// own that it carries across continue-as-new; the reports of the base
	// run's trials, which Temporal applies again to the reset run, name
	// none of its trials. A run that was never reset has the run ID its
	// start event was written with.
	if r.carried != nil {
		r.resetTag = r.carried.ResetTag
	}
	if workflow.GetVersion(ctx, "reset-trial-names", workflow.DefaultVersion, 1) >= 1 &&
		info.OriginalRunID != "" && info.OriginalRunID != info.WorkflowExecution.RunID {
		sum := sha256.Sum256([]byte(info.WorkflowExecution.RunID))
		r.resetTag = "-reset-" + hex.EncodeToString(sum[:4])
	}
	// Trials are named after the search: an ID the server would refuse for
	// a child would fail every workflow task, so it is refused here.
	if err := spec.CheckWorkflowID("the search's workflow ID", info.WorkflowExecution.ID, len("-trial-00000")+len(r.resetTag)); err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	r.sched, _ = s.NewScheduler()
	r.pbt, _ = r.sched.(*tune.PBT)
	// PBT as Ray runs it: a population larger than the slots moves
	// together (a trial at a perturbation point gives its slot to the one
	// that trained least), and an exploit clones its donor's checkpoint as
	// it is decided. Searches recorded before ran trials to their end, and
	// cloned once the trial had stopped.
	r.timeShared = r.pbt != nil && workflow.GetVersion(ctx, "pbt-time-share", workflow.DefaultVersion, 1) >= 1
	// Trials own their checkpoint run names (run-ownership): each is named
	// after the search and its number, never the train spec's one name.
	r.owned = workflow.GetVersion(ctx, "run-ownership", workflow.DefaultVersion, 1) >= 1
	// Big searches move finished rows out and continue as new; searches
	// recorded before kept every row and never did.
	r.bounded = workflow.GetVersion(ctx, "tune-continue-as-new", workflow.DefaultVersion, 1) >= 1
	r.name = s.Name
	if r.name == "" && r.owned {
		r.name = runName(info.WorkflowExecution.ID)
	} else if r.name == "" {
		r.name = legacyRunName(info.WorkflowExecution.ID)
	}
	r.url = s.ResultsURL
	if r.url == "" && len(r.trials) > 0 {
		r.url = r.trials[0].Spec.WithDefaults().Checkpoint.URL
	}
	if r.carried != nil {
		r.res = r.carried.Results
		if err := tune.SetState(r.sched, r.carried.Scheduler); err != nil {
			return nil, temporal.NewNonRetryableApplicationError("the carried scheduler state: "+err.Error(), spec.ErrUser, nil)
		}
		if err := tune.SetSearcherState(r.searcher, r.carried.Searcher); err != nil {
			return nil, temporal.NewNonRetryableApplicationError("the carried searcher state: "+err.Error(), spec.ErrUser, nil)
		}
	} else {
		r.res = &spec.TuneResults{Name: r.name, State: spec.TuneRunning, Metric: s.Metric, Mode: s.Mode, Scope: s.Scope, Scheduler: schedulerName(s.Scheduler), Best: -1}
		listed := len(r.trials)
		if r.bounded {
			r.res.Total = len(r.trials)
			listed = min(listed, spec.MaxListedTrials)
		}
		for i := range listed {
			r.res.Trials = append(r.res.Trials, r.pendingRow(i))
		}
	}
	r.next = r.res.Started
	r.sel = workflow.NewSelector(ctx)
	return r, nil
}

// continueAsNew carries the search, drained, into its next execution, which
// starts the rest.
func (r *search) continueAsNew() error {
	st, err := tune.State(r.sched)
	if err != nil {
		return err
	}
	bestTrialOf(r.res)
	searched, err := tune.SearcherState(r.searcher)
	if err != nil {
		return err
	}
	next, err := encodeTuneInput(r.raw, &tuneCarried{Results: r.res, Scheduler: st, Searcher: searched, Segments: append(r.carry, r.ready...), ResetTag: r.resetTag})
	if err != nil {
		return err
	}
	return workflow.NewContinueAsNewError(r.ctx, spec.WorkflowTune, next)
}

// close ends the search: its state, its best trial, and its results CSV.
func (r *search) close() (*spec.TuneResults, error) {
	ctx, res := r.ctx, r.res
	res.State = searchState(res)
	if ctx.Err() != nil {
		// Cancelled: the running trials have closed; the rest never start.
		for i := range res.Trials {
			if st := res.Trials[i].Status; st == spec.TrialPending || st == spec.TrialExploiting || st == spec.TrialPaused {
				res.Trials[i].Status = spec.TrialCancelled
			}
		}
		if unstarted := len(r.trials) - r.next - listedFrom(res, r.next); r.bounded && unstarted > 0 {
			if res.Unlisted == nil {
				res.Unlisted = map[string]int{}
			}
			res.Unlisted[spec.TrialCancelled] += unstarted
		}
		res.State = spec.TuneCancelled
	}
	bestTrialOf(res)
	// The results are written even for a cancelled search, on a context of
	// their own, bounded by the activity's timeouts.
	wctx, _ := workflow.NewDisconnectedContext(ctx)
	actx := workflow.WithActivityOptions(wctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5}})
	if err := workflow.ExecuteActivity(actx, spec.ActivityWriteTuneResults, spec.WriteTuneResultsInput{URL: r.url, Name: r.name, Results: res}).Get(wctx, &res.ResultsCSV); err != nil {
		workflow.GetLogger(ctx).Warn("the results CSV was not written", "error", err)
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// moveRows moves a big search's finished rows out of its state, once there
// are half of spec.MaxListedTrials of them, to a part in blob storage; if
// the part cannot be written the rows stay, and it tries again later.
func moveRows(ctx workflow.Context, res *spec.TuneResults, url string) {
	if res.Total <= spec.MaxListedTrials {
		return
	}
	var finished, keep []spec.TrialStatus
	for _, t := range res.Trials {
		if trialEnded(t.Status) {
			finished = append(finished, t)
		} else {
			keep = append(keep, t)
		}
	}
	if len(finished) < spec.MaxListedTrials/2 {
		return
	}
	bestTrialOf(res) // the best row stays, as BestTrial
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5}})
	var key string
	if err := workflow.ExecuteActivity(actx, spec.ActivityWriteTuneRows, spec.WriteTuneRowsInput{URL: url, Name: res.Name, Part: len(res.Parts), Rows: finished}).Get(ctx, &key); err != nil {
		workflow.GetLogger(ctx).Warn("finished trials' rows not moved out; keeping them for now", "rows", len(finished), "error", err)
		return
	}
	res.Parts = append(res.Parts, key)
	if res.Unlisted == nil {
		res.Unlisted = map[string]int{}
	}
	for _, t := range finished {
		res.Unlisted[t.Status]++
	}
	res.Trials = keep
}

// listedFrom counts the listed rows of trials numbered from on.
func listedFrom(res *spec.TuneResults, from int) int {
	n := 0
	for _, t := range res.Trials {
		if t.Trial >= from {
			n++
		}
	}
	return n
}
