package simfleet

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/proto"

	"github.com/durabletrain/durabletrain/spec"
)

// Temporal's server defaults (v1.32 dynamic config) that a run lives within.
const (
	LimitPendingActivities = 2000     // limit.numPendingActivities.error
	LimitSignals           = 10000    // history.maximumSignalsPerExecution
	LimitPayloadBytes      = 2 << 20  // limit.blobSize.error
	LimitHistoryEvents     = 51200    // limit.historyCount.error
	LimitHistoryBytes      = 50 << 20 // limit.historySize.error
)

// Report is what a run's histories (every execution of a continue-as-new
// chain) say about its cost to Temporal.
type Report struct {
	Executions int
	Epochs     int
	// GangSeconds: per gang formed, from its first HoldSlot scheduled to the
	// first RunEpoch scheduled on it.
	GangSeconds []float64
	// HandoverSeconds: per continue-as-new whose next run took the gang
	// over, from its first HoldSlot (a handover) to its first RunEpoch.
	HandoverSeconds []float64
	// OverheadSeconds: per epoch, Temporal's part of its wall time (last
	// RunEpoch completed of the epoch before to its own last): the wall
	// time less the longest a host's RunEpoch ran on its worker.
	OverheadSeconds []float64
	// AgentSeconds: per epoch, what the agent did beside the trainer (the
	// longest RunEpoch less the longest trainer time: joining the gang,
	// the leave vote, evaluation, events, checkpoints).
	AgentSeconds []float64
	// Boundary: per epoch, whether it is the first of an execution that
	// continue-as-new started (its overhead includes the crossing).
	Boundary    []bool
	EpochEvents int // events from the first RunEpoch on, over all executions
	// EpochEventTypes: EpochEvents by type ("ActivityTaskScheduled", ...),
	// to say which kind of event a run spent them on.
	EpochEventTypes map[string]int
	MaxPayloadBytes int
	PeakPending     int // activities pending at once, at most
	// Per execution, at most:
	MaxSignals, MaxEvents, MaxHistoryBytes int
}

func (r *Report) countEpochEvent(t enumspb.EventType) {
	r.EpochEvents++
	if r.EpochEventTypes == nil {
		r.EpochEventTypes = map[string]int{}
	}
	r.EpochEventTypes[t.String()]++
}

// EventsPerEpoch is the history events an epoch costs.
func (r Report) EventsPerEpoch() float64 { return float64(r.EpochEvents) / float64(max(1, r.Epochs)) }

// Binding says which of Temporal's limits the run came closest to, and how close.
func (r Report) Binding() (string, float64) {
	limits := []struct {
		name string
		used float64
	}{
		{"pending activities", float64(r.PeakPending) / LimitPendingActivities},
		{"signals per execution", float64(r.MaxSignals) / LimitSignals},
		{"payload size", float64(r.MaxPayloadBytes) / LimitPayloadBytes},
		{"history events", float64(r.MaxEvents) / LimitHistoryEvents},
		{"history size", float64(r.MaxHistoryBytes) / LimitHistoryBytes},
	}
	best := limits[0]
	for _, l := range limits[1:] {
		if l.used > best.used {
			best = l
		}
	}
	return best.name, best.used
}

// Quantile is the q-quantile of xs (nearest rank), 0 if empty.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(len(s)-1, i))]
}

// Measure reads the histories of workflow id's run chain, from its first
// execution, once the run has closed.
func Measure(ctx context.Context, c client.Client, id, firstRunID string) (Report, error) {
	var rep Report
	type epochMark struct {
		lastDone time.Time
		trainer  float64 // the longest a host's trainer took
		activity float64 // the longest a host's RunEpoch ran
		boundary bool    // the first epoch after a continue-as-new
	}
	epochs := map[int]*epochMark{}
	runEpochs := map[int64]bool{}    // the RunEpoch scheduled events
	started := map[int64]time.Time{} // RunEpoch scheduled event -> when a worker started it
	var gangStart, handoverStart time.Time
	var prevDone time.Time
	pending := 0
	runID := firstRunID
	for runID != "" {
		rep.Executions++
		next := ""
		events, signals, bytes := 0, 0, 0
		seenEpoch := false
		boundary := rep.Executions > 1 // until this execution's first epoch is done
		it := c.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			e, err := it.Next()
			if err != nil {
				return rep, err
			}
			events++
			bytes += proto.Size(e)
			t := e.GetEventTime().AsTime()
			for _, p := range payloadsOf(e) {
				rep.MaxPayloadBytes = max(rep.MaxPayloadBytes, proto.Size(p))
			}
			if seenEpoch {
				rep.countEpochEvent(e.GetEventType())
			}
			switch e.GetEventType() {
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
				pending++
				rep.PeakPending = max(rep.PeakPending, pending)
				a := e.GetActivityTaskScheduledEventAttributes()
				switch a.GetActivityType().GetName() {
				case spec.ActivityHoldSlot:
					var in spec.HoldSlotInput
					if ps := a.GetInput().GetPayloads(); len(ps) > 0 {
						json.Unmarshal(ps[0].GetData(), &in)
					}
					switch {
					case in.Handover != nil && handoverStart.IsZero():
						handoverStart = t
					case in.Handover == nil && gangStart.IsZero():
						gangStart = t
					}
				case spec.ActivityRunEpoch:
					if !seenEpoch {
						seenEpoch = true
						rep.countEpochEvent(e.GetEventType())
					}
					if !gangStart.IsZero() {
						rep.GangSeconds = append(rep.GangSeconds, t.Sub(gangStart).Seconds())
						gangStart = time.Time{}
					} else if !handoverStart.IsZero() {
						rep.HandoverSeconds = append(rep.HandoverSeconds, t.Sub(handoverStart).Seconds())
					}
					handoverStart = time.Time{}
					runEpochs[e.GetEventId()] = true
					if prevDone.IsZero() {
						prevDone = t
					}
				}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_STARTED:
				started[e.GetActivityTaskStartedEventAttributes().GetScheduledEventId()] = t
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
				pending--
				a := e.GetActivityTaskCompletedEventAttributes()
				if !runEpochs[a.GetScheduledEventId()] {
					continue
				}
				var res spec.EpochResult
				if ps := a.GetResult().GetPayloads(); len(ps) > 0 {
					json.Unmarshal(ps[0].GetData(), &res)
				}
				ep := res.Metrics.Epoch // the epoch the host trained (after a failure, its checkpoint's)
				m := epochs[ep]
				if m == nil {
					m = &epochMark{}
					epochs[ep] = m
				}
				m.lastDone = t
				m.boundary = m.boundary || boundary
				boundary = false
				m.trainer = max(m.trainer, res.Metrics.Seconds)
				if st, ok := started[a.GetScheduledEventId()]; ok {
					m.activity = max(m.activity, t.Sub(st).Seconds())
				}
			case enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED, enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCELED, enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
				pending--
			case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
				signals++
			case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
				next = e.GetWorkflowExecutionContinuedAsNewEventAttributes().GetNewExecutionRunId()
			}
		}
		pending = 0 // a new execution starts with none (its holds are its own)
		rep.MaxSignals = max(rep.MaxSignals, signals)
		rep.MaxEvents = max(rep.MaxEvents, events)
		rep.MaxHistoryBytes = max(rep.MaxHistoryBytes, bytes)
		runID = next
	}
	keys := make([]int, 0, len(epochs))
	for k := range epochs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		m := epochs[k]
		rep.OverheadSeconds = append(rep.OverheadSeconds, m.lastDone.Sub(prevDone).Seconds()-m.activity)
		rep.AgentSeconds = append(rep.AgentSeconds, m.activity-m.trainer)
		rep.Boundary = append(rep.Boundary, m.boundary)
		prevDone = m.lastDone
	}
	rep.Epochs = len(keys)
	if rep.Epochs == 0 {
		return rep, fmt.Errorf("workflow %s: no epoch completed", id)
	}
	return rep, nil
}

// Overheads are the epochs' overheads split into those of the first epoch
// after each continue-as-new and the rest.
func (r Report) Overheads() (boundary, others []float64) {
	for i, x := range r.OverheadSeconds {
		if i < len(r.Boundary) && r.Boundary[i] {
			boundary = append(boundary, x)
		} else {
			others = append(others, x)
		}
	}
	return boundary, others
}

// payloadsOf are the payloads an event carries: inputs, results, signal
// arguments, markers, memos.
func payloadsOf(e *historypb.HistoryEvent) []*commonpb.Payloads {
	var out []*commonpb.Payloads
	add := func(p *commonpb.Payloads) {
		if p != nil {
			out = append(out, p)
		}
	}
	add(e.GetWorkflowExecutionStartedEventAttributes().GetInput())
	add(e.GetWorkflowExecutionCompletedEventAttributes().GetResult())
	add(e.GetWorkflowExecutionContinuedAsNewEventAttributes().GetInput())
	add(e.GetActivityTaskScheduledEventAttributes().GetInput())
	add(e.GetActivityTaskCompletedEventAttributes().GetResult())
	add(e.GetActivityTaskFailedEventAttributes().GetFailure().GetApplicationFailureInfo().GetDetails())
	add(e.GetWorkflowExecutionSignaledEventAttributes().GetInput())
	for _, p := range e.GetMarkerRecordedEventAttributes().GetDetails() {
		add(p)
	}
	return out
}

// Chain is what a workflow's continue-as-new chain cost Temporal, per
// execution at most: any workflow's (Measure reads a training run's epochs).
type Chain struct {
	Executions                                              int
	Events                                                  int // over all executions
	MaxEvents, MaxSignals, MaxHistoryBytes, MaxPayloadBytes int
}

// MeasureChain reads every execution of workflow id's chain from firstRunID on.
func MeasureChain(ctx context.Context, c client.Client, id, firstRunID string) (Chain, error) {
	var ch Chain
	for runID := firstRunID; runID != ""; {
		ch.Executions++
		next := ""
		events, signals, bytes := 0, 0, 0
		it := c.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			e, err := it.Next()
			if err != nil {
				return ch, err
			}
			events++
			bytes += proto.Size(e)
			for _, p := range payloadsOf(e) {
				ch.MaxPayloadBytes = max(ch.MaxPayloadBytes, proto.Size(p))
			}
			switch e.GetEventType() {
			case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
				signals++
			case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
				next = e.GetWorkflowExecutionContinuedAsNewEventAttributes().GetNewExecutionRunId()
			}
		}
		ch.Events += events
		ch.MaxEvents, ch.MaxSignals, ch.MaxHistoryBytes = max(ch.MaxEvents, events), max(ch.MaxSignals, signals), max(ch.MaxHistoryBytes, bytes)
		runID = next
	}
	return ch, nil
}
