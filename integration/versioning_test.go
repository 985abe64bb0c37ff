package integration

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/durabletrain/durabletrain/spec"
)

// TestWorkerDeploymentVersioning: a worker started with -deployment-name
// polls as version NAME:BUILD_ID (its binary's build ID); once the Temporal
// CLI makes that version current, a run executes on it with the
// auto-upgrade behaviour.
func TestWorkerDeploymentVersioning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	cli := temporalCLI(t)
	queue := "it-deploy"
	w := startWorkerWith(t, "worker-v", "both", queue, append(append([]string{}, testPolicy...), "-deployment-name", "it-deploy"))
	buildID := waitLine(t, w, regexp.MustCompile(`"build_id":"([^"]+)"`), 30*time.Second)[1]
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := exec.Command(cli, "worker", "deployment", "set-current-version", "--deployment-name", "it-deploy",
			"--build-id", buildID, "--yes", "--address", server.Addr(), "--namespace", "default").CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) { // the version exists once the worker has polled
			t.Fatalf("temporal worker deployment set-current-version: %v\n%s", err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	c := dial(t)
	p := awaitRun(t, startRun(t, c, "it-deploy-1", queue, subsetSpec(t, queue, 1, 1)), 2*time.Minute)
	if p.State != spec.StateCompleted {
		t.Fatalf("the run on the versioned worker: %+v", p)
	}
	desc, err := c.DescribeWorkflowExecution(context.Background(), "it-deploy-1", "")
	if err != nil {
		t.Fatal(err)
	}
	v := desc.GetWorkflowExecutionInfo().GetVersioningInfo()
	if v.GetDeploymentVersion().GetBuildId() != buildID || v.GetDeploymentVersion().GetDeploymentName() != "it-deploy" ||
		v.GetBehavior() != enumspb.VERSIONING_BEHAVIOR_AUTO_UPGRADE {
		t.Fatalf("the run's versioning info %v; want deployment it-deploy, build %s, auto-upgrade", v, buildID)
	}
	if !strings.HasPrefix(buildID, "v") {
		t.Fatalf("build ID %q", buildID)
	}
}
