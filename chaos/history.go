package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"
)

// saveHistory writes the run's workflow history, one line per event (its
// time, id, type and who took it), to logs/<run>.history beside the hosts'
// logs: the evidence for a fault that took longer than it should (a
// workflow task or a hold taken by a stopped or cut-off host shows as a
// task started by that host and timed out), kept until the next session
// wipes the directory.
func (h *Harness) saveHistory(ctx context.Context, run string) error {
	f, err := os.Create(filepath.Join(h.cfg.Dir, "logs", run+".history"))
	if err != nil {
		return err
	}
	defer f.Close()
	it := h.client.GetWorkflowHistory(ctx, run, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return err
		}
		writeEvent(f, e)
	}
	return nil
}

// writeEvent writes one event as a line: UTC time, id, type, and what
// tells who took it or why it ended.
func writeEvent(w io.Writer, e *history.HistoryEvent) {
	what := ""
	switch {
	case e.GetWorkflowTaskStartedEventAttributes() != nil:
		what = e.GetWorkflowTaskStartedEventAttributes().GetIdentity()
	case e.GetWorkflowTaskTimedOutEventAttributes() != nil:
		what = e.GetWorkflowTaskTimedOutEventAttributes().GetTimeoutType().String()
	case e.GetActivityTaskScheduledEventAttributes() != nil:
		a := e.GetActivityTaskScheduledEventAttributes()
		what = a.GetActivityType().GetName() + " on " + a.GetTaskQueue().GetName()
	case e.GetActivityTaskStartedEventAttributes() != nil:
		a := e.GetActivityTaskStartedEventAttributes()
		what = fmt.Sprintf("%s (scheduled %d, attempt %d)", a.GetIdentity(), a.GetScheduledEventId(), a.GetAttempt())
	case e.GetActivityTaskTimedOutEventAttributes() != nil:
		a := e.GetActivityTaskTimedOutEventAttributes()
		what = fmt.Sprintf("scheduled %d: %s", a.GetScheduledEventId(), a.GetFailure().GetMessage())
	case e.GetActivityTaskFailedEventAttributes() != nil:
		a := e.GetActivityTaskFailedEventAttributes()
		what = fmt.Sprintf("scheduled %d: %.160s", a.GetScheduledEventId(), a.GetFailure().GetMessage())
	case e.GetWorkflowExecutionSignaledEventAttributes() != nil:
		what = e.GetWorkflowExecutionSignaledEventAttributes().GetSignalName()
	}
	fmt.Fprintf(w, "%s %5d %-40s %s\n", e.GetEventTime().AsTime().UTC().Format("15:04:05.000"), e.GetEventId(), e.GetEventType(), what)
}

// stamp is a fault's injection time as the history files write it ("–"
// for a fault that was never injected).
func stamp(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("15:04:05.000")
}
