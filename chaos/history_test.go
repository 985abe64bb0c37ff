package chaos

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A history line names the event and who took it: what a slow recovery is
// read off (a task started by a stopped host, then timed out).
func TestHistoryLinesNameWhoTookATask(t *testing.T) {
	at := time.Date(2026, 11, 24, 11, 34, 5, 928_000_000, time.UTC)
	events := []*history.HistoryEvent{
		{EventId: 96, EventTime: timestamppb.New(at), EventType: enums.EVENT_TYPE_ACTIVITY_TASK_STARTED,
			Attributes: &history.HistoryEvent_ActivityTaskStartedEventAttributes{ActivityTaskStartedEventAttributes: &history.ActivityTaskStartedEventAttributes{
				Identity: "host-1", ScheduledEventId: 79, Attempt: 1}}},
		{EventId: 35, EventTime: timestamppb.New(at), EventType: enums.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
			Attributes: &history.HistoryEvent_WorkflowTaskTimedOutEventAttributes{WorkflowTaskTimedOutEventAttributes: &history.WorkflowTaskTimedOutEventAttributes{
				TimeoutType: enums.TIMEOUT_TYPE_SCHEDULE_TO_START}}},
	}
	var b bytes.Buffer
	for _, e := range events {
		writeEvent(&b, e)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, want := range [][]string{
		{"11:34:05.928", "96", "ActivityTaskStarted", "host-1 (scheduled 79, attempt 1)"},
		{"11:34:05.928", "35", "WorkflowTaskTimedOut", "ScheduleToStart"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %q lacks %q", lines[i], w)
			}
		}
	}
}
