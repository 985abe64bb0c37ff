package workflows

// The run's decisions, as pure functions of their inputs (etcd/raft's habit):
// no workflow.Context, no SDK call, so policy_test.go checks them with tables.
// The workflow code around them only gathers inputs and carries out answers.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// ContinueAsNewAfterEvents bounds the history of one run (Temporal caps it at
// 51,200 events): past it, at an epoch boundary, the run continues as new.
const ContinueAsNewAfterEvents = 10000

// Gang formation backs off this long at first after a gang timeout (or the
// gang timeout, if shorter), doubling up to gangBackoffMax.
const (
	gangBackoffBase = 5 * time.Second
	gangBackoffMax  = 2 * time.Minute
)

// gangBackoff is how long to wait before the next try at forming a gang,
// after attempt failed ones (0 for the first), plus jitter in [0, base).
func gangBackoff(attempt int, gangTimeout time.Duration, jitterNanos int64) time.Duration {
	base := min(gangBackoffBase, max(gangTimeout, time.Second))
	jitter := time.Duration(jitterNanos % int64(base))
	if jitter < 0 {
		jitter = -jitter
	}
	return min(base<<min(attempt, 5), gangBackoffMax) + jitter
}

// checkpointAfter says whether the ranks checkpoint after epoch: every
// checkpoint.every_epochs, after the last epoch, and after every epoch of a
// degraded gang (so growing back loses nothing).
func checkpointAfter(s spec.Training, epoch, epochs, world int) bool {
	return (epoch+1)%s.Checkpoint.EveryEpochs == 0 || epoch+1 == epochs || world < s.Scaling.Workers
}

// rankBatch is each rank's batch in a gang of world ranks: the global batch
// stays hyper.batch_size × scaling.workers whatever the gang's size.
func rankBatch(s spec.Training, world int) int {
	return (s.Hyper.BatchSize*s.Scaling.Workers + world - 1) / world
}

// ContinueAsNewAfterSignals bounds the signals one run receives (Temporal
// fails a workflow past 10,000: history.maximumSignalsPerExecution); each
// gang formation brings one per host.
const ContinueAsNewAfterSignals = 5000

// continueAsNew says whether a run continues as new now, at an epoch
// boundary, having received signals signals.
func continueAsNew(p *spec.Progress, historyLength, signals int, suggested bool) bool {
	return p.Epoch < p.Epochs && !p.Stopping && (historyLength >= ContinueAsNewAfterEvents || signals >= ContinueAsNewAfterSignals || suggested)
}

// raisedStallTimeout is the stall timeout a run that chooses its own
// (current > 0) takes after a rank its ring declared stalled heard the
// verdict, having sent nothing for silence: twice that silence (to the
// millisecond), and at
// least twice current, but at most half of heartbeat, so that a stall is
// still reported before Temporal's heartbeat timeout. false: the stall
// stands as a failure, for there is no room to raise the timeout, or the
// raised one would have declared the same silence a stall too (the ring
// declares one after 3/4 of its timeout at the earliest): a rank silent
// that long was not briefly starved. A silence shorter than that
// earliest declaration (3/4 of current) does not explain the verdict
// either (the rank's frames were lost on their way, or the word is not a
// worker's): that stall stands too.
func raisedStallTimeout(current, heartbeat, silence time.Duration) (time.Duration, bool) {
	if current <= 0 || silence < current*3/4 || silence <= 0 {
		return 0, false
	}
	raised := min(heartbeat/2, max(2*current, (2*silence).Round(time.Millisecond)))
	if raised <= current || silence >= raised*3/4 {
		return 0, false
	}
	return raised, true
}

// askAgainAfter says whether a hold that ended before its grant is worth
// asking for again: yes if a worker took it and lost it (its heartbeat
// timed out, it could not tell the run, it stopped, it had too few slots);
// no if no worker took it within the gang timeout, it was cancelled, or
// the request itself is wrong.
func askAgainAfter(err error) bool {
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) && timeout.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
		return false
	}
	var cancelled *temporal.CanceledError
	if err == nil || errors.As(err, &cancelled) {
		return false
	}
	return errorType(err) != spec.ErrUser
}

// Failure kinds errorKind tells apart: the two application error types the
// activities use, and everything else.
const kindInfrastructure = "infrastructure"

// errorType is an application error's type, or "".
func errorType(err error) string {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return app.Type()
	}
	return ""
}

// errorKind tells user errors and preemptions from infrastructure failures.
func errorKind(err error) string {
	switch t := errorType(err); t {
	case spec.ErrUser, spec.ErrPreempted, spec.ErrForgedGrant:
		return t
	}
	return kindInfrastructure
}

// charge counts an epoch's failure against its budget. It returns the
// incident to record (nil for a user error), and the error that ends the run,
// if it does: a user error, or a budget exhausted.
func charge(p *spec.Progress, f spec.Failure, epoch int, err error) (*spec.Incident, error) {
	inc := &spec.Incident{Generation: p.Generation, Epoch: epoch, Detail: err.Error()}
	switch errorKind(err) {
	case spec.ErrUser:
		return nil, err
	case spec.ErrForgedGrant:
		// Someone outside the pool signalled a placement: not the run's
		// failure, so not charged; the next gang forms on real workers.
		inc.Kind = spec.IncidentForgedGrant
	case spec.ErrPreempted:
		inc.Kind = spec.IncidentPreemption
		p.Preemptions++
		if p.Preemptions > f.PreemptionBudget() {
			return inc, fmt.Errorf("%d preemptions exceed failure.max_preemptions %d; last: %w", p.Preemptions, f.PreemptionBudget(), err)
		}
	default:
		inc.Kind = spec.IncidentFailure
		p.Failures++
		if p.Failures > f.FailureBudget() {
			return inc, fmt.Errorf("%d failures exceed failure.max_failures %d; last: %w", p.Failures, f.FailureBudget(), err)
		}
	}
	return inc, nil
}

// runFailure is the error a failed run ends with: non-retryable, typed as a
// user error or an exhausted budget, with a one-line message.
func runFailure(err error) error {
	if errorKind(err) == spec.ErrUser {
		return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	// The message says it all; a cause would print the same chain again.
	return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrBudgetExhausted, nil)
}

// epochOutcome is what one epoch of a gang came to.
type epochOutcome struct {
	result *spec.EpochResult   // a rank's full result, if the epoch counts
	latest *spec.CheckpointRef // the newest checkpoint any rank reported, even in an error
	err    error               // why the gang ended, if it did
	// survivors are the gang's hosts to keep for the next gang, by host
	// index (run.reuseHolds; see survivors).
	survivors []int
	// stalled is the rank a host declared stalled (stallOf), or -1, and
	// heard the word of its host that it heard the verdict, if it said so.
	stalled int
	heard   *spec.StallHeard
}

// rankEnd is how one rank's RunEpoch ended.
type rankEnd struct {
	where  string // "rank 1 on worker-a", for messages
	result spec.EpochResult
	err    error
}

// mergeEpoch decides what an epoch came to from how each rank ended, the
// first failure seen (a rank's, or a lost slot lease; nil if none), and the
// checkpoints slots of stopping workers reported.
//   - The epoch counts if every rank finished it, or if a rank that finished
//     it committed its checkpoint (the rest failed after the state was safe).
//   - The newest checkpoint anyone reported is kept, even from an error.
//   - The gang's end is explained by the most telling error: a user error
//     (no new gang can help) before a preemption (charged to its own budget)
//     before the first failure seen.
func mergeEpoch(ranks []rankEnd, first error, leftWith []*spec.CheckpointRef) epochOutcome {
	out := epochOutcome{stalled: -1}
	for i, r := range ranks {
		if r.err != nil {
			out.latest = newer(out.latest, checkpointIn(r.err))
			continue
		}
		out.latest = newer(out.latest, r.result.Checkpoint)
		if out.result == nil && (first == nil || r.result.Checkpoint != nil) {
			out.result = &ranks[i].result
		}
	}
	for _, ref := range leftWith {
		out.latest = newer(out.latest, ref)
	}
	if first == nil {
		return out
	}
	out.err = first
	for _, kind := range []string{spec.ErrUser, spec.ErrPreempted} {
		if errorKind(first) == kind {
			return out
		}
		for _, r := range ranks {
			if r.err != nil && errorKind(r.err) == kind {
				out.err = &rankError{what: r.where, err: r.err}
				return out
			}
		}
	}
	return out
}

// brokenBy is what a host's epoch error says of the rank that broke the
// gang, if the host's ranks ended only because of it (spec.BrokenBy); nil
// for any other end.
func brokenBy(err error) *spec.BrokenBy {
	var app *temporal.ApplicationError
	if err == nil || !errors.As(err, &app) || !app.HasDetails() {
		return nil
	}
	var b spec.BrokenBy
	switch app.Type() {
	case spec.ErrPeerFailed:
		if app.Details(&b) != nil {
			return nil
		}
	case spec.ErrPreempted:
		var ref spec.CheckpointRef
		if app.Details(&ref, &b) != nil || b.Reason == "" {
			return nil
		}
	default:
		return nil
	}
	return &b
}

// stallOf is the rank a host of a broken gang was declared stalled by
// another host's, by either host's epoch error, or -1; and, if the
// declared rank's host said it heard the verdict (spec.ErrStalledHeard),
// its word. Either error may be all the run saw: the other host's epoch,
// cancelled once the first failed, reports nothing.
func stallOf(ranks []rankEnd) (int, *spec.StallHeard) {
	rank := -1
	for _, r := range ranks {
		if b := brokenBy(r.err); b != nil && b.Rank >= 0 && b.Stalled {
			rank = b.Rank
			break
		}
	}
	for _, r := range ranks {
		var app *temporal.ApplicationError
		var h spec.StallHeard
		if errors.As(r.err, &app) && app.Type() == spec.ErrStalledHeard && app.HasDetails() && app.Details(&h) == nil && (rank < 0 || h.Rank == rank) {
			return h.Rank, &h
		}
	}
	return rank, nil
}

// hostOf is the index of the host whose ranks include rank, or -1.
func hostOf(placements []spec.Placement, perHost, rank int) int {
	for i, pl := range placements {
		if rank >= pl.Rank && rank < pl.Rank+perHost {
			return i
		}
	}
	return -1
}

// blamed marks the hosts that a settled host's epoch error blames.
func blamed(ranks []rankEnd, settled []bool, placements []spec.Placement, perHost int) []bool {
	out := make([]bool, len(placements))
	for i, r := range ranks {
		if b := brokenBy(r.err); settled[i] && b != nil && b.Rank >= 0 {
			if h := hostOf(placements, perHost, b.Rank); h >= 0 {
				out[h] = true
			}
		}
	}
	return out
}

// awaitingSurvivors says whether a broken gang may still hear from a
// surviving host: some host has said it survived, and some host that
// nobody blamed, whose hold is good, has not ended its epoch yet.
func awaitingSurvivors(ranks []rankEnd, settled, holdEnded []bool, placements []spec.Placement, perHost int) bool {
	heard := false
	for i, r := range ranks {
		heard = heard || settled[i] && brokenBy(r.err) != nil
	}
	if !heard {
		return false
	}
	blame := blamed(ranks, settled, placements, perHost)
	for i := range ranks {
		if !settled[i] && !blame[i] && !holdEnded[i] {
			return true
		}
	}
	return false
}

// survivors are the hosts of a broken gang that the next gang keeps: those
// whose ranks ended only because another host's rank failed (brokenBy),
// whose hold is still good, and that no host blamed. A host that blames
// another while being blamed itself (both sides of a partition) is not kept.
func survivors(ranks []rankEnd, settled, holdEnded []bool, placements []spec.Placement, perHost int) []int {
	blame := blamed(ranks, settled, placements, perHost)
	var out []int
	for i, r := range ranks {
		if settled[i] && !holdEnded[i] && !blame[i] && brokenBy(r.err) != nil {
			out = append(out, i)
		}
	}
	return out
}

// checkpointIn is the checkpoint a preempted rank or slot reported in its error.
func checkpointIn(err error) *spec.CheckpointRef {
	var app *temporal.ApplicationError
	if err == nil || !errors.As(err, &app) || app.Type() != spec.ErrPreempted || !app.HasDetails() {
		return nil
	}
	var ref spec.CheckpointRef
	if app.Details(&ref) != nil || ref.ID == "" {
		return nil
	}
	return &ref
}

// newer is the later of two checkpoints by cursor.
func newer(a, b *spec.CheckpointRef) *spec.CheckpointRef {
	switch {
	case b == nil:
		return a
	case a == nil || b.Epoch > a.Epoch || b.Epoch == a.Epoch && b.Step > a.Step:
		return b
	}
	return a
}

// rankError names where an epoch failed and keeps the activity's error for
// errorKind, but reads as one line: the SDK's activity and application errors
// repeat their causes and metadata in Error().
type rankError struct {
	what string
	err  error
}

func (e *rankError) Error() string { return e.what + ": " + shortError(e.err) }
func (e *rankError) Unwrap() error { return e.err }

// shortError is the innermost message a person needs: an application error's
// own message, a timeout's kind, or the error as it is.
func shortError(err error) string {
	var app *temporal.ApplicationError
	var timeout *temporal.TimeoutError
	switch {
	case errors.As(err, &app):
		return app.Message()
	case errors.As(err, &timeout):
		return strings.ToLower(strings.TrimPrefix(timeout.TimeoutType().String(), "TIMEOUT_TYPE_")) + " timeout (the worker stopped answering)"
	}
	return err.Error()
}

// where names a host's ranks and worker in messages: "rank 3 on worker-a",
// or "ranks 8-15 on host-b" for a host of several.
func where(pl spec.Placement, s spec.Training) string {
	if n := max(1, s.Scaling.WorkersPerHost); n > 1 {
		return fmt.Sprintf("ranks %d-%d on %s", pl.Rank, pl.Rank+n-1, pl.Worker)
	}
	return fmt.Sprintf("rank %d on %s", pl.Rank, pl.Worker)
}

// leaseErr is why a slot's lease ended.
func leaseErr(err error) error {
	if err == nil {
		return errors.New("the slot was released by its worker")
	}
	return err
}

// skippedIncident is the incident for a checkpoint a restore passed over as
// damaged, or nil if the run already has it for that gang.
func skippedIncident(incidents []spec.Incident, gen, epoch int, s spec.SkippedCheckpoint) *spec.Incident {
	detail := s.ID + ": " + s.Reason
	for _, inc := range incidents {
		if inc.Kind == spec.IncidentCorruptCheckpoint && inc.Generation == gen && inc.Detail == detail {
			return nil
		}
	}
	return &spec.Incident{Generation: gen, Epoch: epoch, Kind: spec.IncidentCorruptCheckpoint, Detail: detail}
}

var unsafeRunChars = regexp.MustCompile(`[^A-Za-z0-9._=+@-]`)

// runName turns a workflow ID into a checkpoint run name, one to one: an ID
// that is not a run name as it stands (characters replaced, or too long)
// gets a digest of the whole ID, so that "a/b" and "a-b" stay apart.
func runName(workflowID string) string {
	n := legacyRunName(workflowID)
	if n == workflowID {
		return n
	}
	sum := sha256.Sum256([]byte(workflowID))
	digest := hex.EncodeToString(sum[:6])
	return n[:min(len(n), 200-1-len(digest))] + "-" + digest
}

// legacyRunName is the run name of runs that began before run ownership
// (the run-ownership version): several IDs may share one.
func legacyRunName(workflowID string) string {
	n := unsafeRunChars.ReplaceAllString(workflowID, "-")
	n = strings.TrimLeft(n, "._=+@-")
	if n == "" {
		n = "run"
	}
	if len(n) > 200 {
		n = n[:200]
	}
	return n
}
