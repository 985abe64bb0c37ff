package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
)

func query(cl client.Client, id string) (*spec.Progress, error) {
	v, err := cl.QueryWorkflow(context.Background(), id, "", spec.QueryProgress)
	if err != nil {
		return nil, fmt.Errorf("querying run %s: %w", id, err)
	}
	var p *spec.Progress
	return p, v.Get(&p)
}

// runCommand parses the flags of a command about one run (-id) and dials Temporal.
func runCommand(name string, args []string, extra func(*flag.FlagSet)) (client.Client, string) {
	var c common
	return runCommandWith(&c, name, args, extra)
}

// runCommandWith is runCommand for a command that also needs the
// connection's options afterwards (its data converter).
func runCommandWith(c *common, name string, args []string, extra func(*flag.FlagSet)) (client.Client, string) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	c.flags(fs)
	id := fs.String("id", "", "workflow ID of the run")
	if extra != nil {
		extra(fs)
	}
	fs.Parse(args)
	if *id == "" {
		fail(exitUsage, "%s needs -id, the run's workflow ID", name)
	}
	return c.dial(), *id
}

func status(args []string) {
	var asJSON *bool
	var c common
	cl, id := runCommandWith(&c, "status", args, func(fs *flag.FlagSet) { asJSON = fs.Bool("json", false, "print the whole progress as JSON") })
	defer cl.Close()
	p, err := query(cl, id)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	if *asJSON {
		b, _ := json.MarshalIndent(p, "", "  ")
		fmt.Println(string(b))
		return
	}
	fmt.Println(progressLine(p, 0))
	for _, pl := range p.Gang {
		gpu := pl.GPU
		if gpu == "" {
			gpu = "CPU slot"
		}
		fmt.Printf("  rank %d on %s slot %d (%s)\n", pl.Rank, pl.Worker, pl.Slot, gpu)
	}
	if p.Latest != nil {
		fmt.Printf("  latest checkpoint %s/%s\n", p.Latest.Run, p.Latest.ID)
	}
	printHeartbeats(cl, c.converter(), id)
}

// printHeartbeats shows the latest heartbeat of each of the run's
// activities now running (a host's epoch, a held slot): the step it is at
// and, on a GPU slot, the NVML readings it carries, as the Temporal UI's
// pending activities do. A run that has ended has none.
func printHeartbeats(cl client.Client, dc converter.DataConverter, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := cl.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		fmt.Printf("  (no heartbeats: %v)\n", err)
		return
	}
	for _, pa := range d.GetPendingActivities() {
		if pa.GetHeartbeatDetails() == nil {
			continue
		}
		var details map[string]any
		if err := dc.FromPayloads(pa.GetHeartbeatDetails(), &details); err != nil {
			fmt.Printf("  %s: heartbeat details unreadable: %v\n", pa.GetActivityType().GetName(), err)
			continue
		}
		b, _ := json.Marshal(details) // sorted keys
		age := time.Since(pa.GetLastHeartbeatTime().AsTime()).Round(100 * time.Millisecond)
		fmt.Printf("  %s on %s, heartbeat %v ago: %s\n", pa.GetActivityType().GetName(), pa.GetLastWorkerIdentity(), age, b)
	}
}

func stop(args []string) {
	var noWait *bool
	cl, id := runCommand("stop", args, func(fs *flag.FlagSet) {
		noWait = fs.Bool("no-wait", false, "only ask (a signal); do not wait for the run to checkpoint and end")
	})
	defer cl.Close()
	ctx := context.Background()
	if *noWait {
		if err := cl.SignalWorkflow(ctx, id, "", spec.SignalStop, nil); err != nil {
			fail(exitFailed, "stopping %s: %v", id, err)
		}
		fmt.Printf("asked run %s to stop after its current epoch\n", id)
		return
	}
	fmt.Printf("stopping run %s after its current epoch...\n", id)
	h, err := cl.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: id, UpdateName: spec.UpdateStop,
		WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		fail(exitFailed, "stopping %s: %v", id, err)
	}
	var res spec.StopResult
	if err := h.Get(ctx, &res); err != nil {
		fail(exitFailed, "stopping %s: %v", id, err)
	}
	fmt.Printf("run %s %s after %d epochs", id, res.State, res.Epoch)
	if res.Latest != nil {
		fmt.Printf("; checkpoint %s/%s (epoch %d step %d)", res.Latest.Run, res.Latest.ID, res.Latest.Epoch, res.Latest.Step)
	}
	fmt.Println()
}

func list(args []string) {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	var c common
	c.flags(fs)
	limit := fs.Int("n", 20, "how many runs and searches, newest first")
	fs.Parse(args)
	cl := c.dial()
	defer cl.Close()
	resp, err := cl.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
		PageSize: int32(*limit), Query: "WorkflowType = '" + spec.WorkflowTraining + "' OR WorkflowType = '" + spec.WorkflowTune + "'"})
	if err != nil {
		fail(exitFailed, "listing runs: %v", err)
	}
	if len(resp.Executions) == 0 {
		fmt.Println("no runs or searches yet (starter train, starter tune)")
		return
	}
	fmt.Printf("%-40s %-6s %-12s %-19s  %s\n", "ID", "KIND", "STATE", "STARTED", "")
	for _, e := range resp.Executions {
		kind := "run"
		switch {
		case e.GetType().GetName() == spec.WorkflowTune:
			kind = "search"
		case e.GetParentExecution() != nil:
			kind = "trial"
		}
		status := strings.ToLower(strings.TrimPrefix(e.Status.String(), "WORKFLOW_EXECUTION_STATUS_"))
		// Runs started with search_attributes say their own state and epoch.
		var state string
		var epoch int64 = -1
		if f := e.GetSearchAttributes().GetIndexedFields(); f != nil {
			converter.GetDefaultDataConverter().FromPayload(f[spec.SearchAttributeState], &state)
			converter.GetDefaultDataConverter().FromPayload(f[spec.SearchAttributeEpoch], &epoch)
		}
		if state != "" {
			status = state
		}
		line := fmt.Sprintf("%-40s %-6s %-12s %-19s", e.Execution.WorkflowId, kind, status, e.StartTime.AsTime().Local().Format(time.DateTime))
		if epoch >= 0 {
			line += fmt.Sprintf("  epoch %d", epoch)
		}
		if p := e.GetParentExecution(); p != nil {
			line += "  of " + p.GetWorkflowId()
		}
		fmt.Println(line)
	}
}

func isTerminal() bool {
	st, err := os.Stdout.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func checkpoints(args []string) {
	cl, id := runCommand("checkpoints", args, nil)
	defer cl.Close()
	p, err := query(cl, id)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	if p.Latest == nil {
		fmt.Printf("run %s has no checkpoint yet\n", id)
		return
	}
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	defer store.Close()
	ids, err := store.IDs(ctx, p.Run)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	for _, cid := range ids {
		c, err := store.Verify(ctx, p.Run, cid)
		if err != nil {
			fmt.Printf("%s  NOT USABLE: %v\n", cid, err)
			continue
		}
		m := c.Manifest
		fmt.Printf("%s  epoch %d step %d  test accuracy %.4f  %s\n", cid, m.Epoch, m.Step, m.Metrics["test_accuracy"], m.Created.Format(time.RFC3339))
	}
}
