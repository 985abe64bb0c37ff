package integration

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/buildinfo"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tensorboard"
	"github.com/durabletrain/durabletrain/testkit/devserver"
)

// runStarter runs the starter and returns its output and exit status.
func runStarter(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("starter %s: %v", strings.Join(args, " "), err)
	return "", -1
}

// TestStarterHelpsANewcomer: help with one line per command, a command's
// flags, the version, and usage errors with status 2.
func TestStarterHelpsANewcomer(t *testing.T) {
	bin := buildStarter(t)
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		out, code := runStarter(t, bin, args...)
		if code != 0 {
			t.Errorf("starter %s: exit %d\n%s", args[0], code, out)
		}
		for _, cmd := range []string{"train", "status", "stop", "list", "checkpoints", "resume", "plot", "tune", "codec-server", "version"} {
			if !regexp.MustCompile(`(?m)^  ` + cmd + ` +\S`).MatchString(out) {
				t.Errorf("starter %s does not list %q with what it does:\n%s", args[0], cmd, out)
			}
		}
	}
	if out, code := runStarter(t, bin); code != 2 || !strings.Contains(out, "Commands:") {
		t.Errorf("starter with no command: exit %d, want 2 and the command list\n%s", code, out)
	}
	if out, code := runStarter(t, bin, "trian"); code != 2 || !strings.Contains(out, `unknown command "trian"`) || !strings.Contains(out, "train") {
		t.Errorf("starter trian: exit %d\n%s", code, out)
	}
	if out, code := runStarter(t, bin, "help", "train"); code != 0 || !strings.Contains(out, "-workers") || !strings.Contains(out, "-address") {
		t.Errorf("starter help train: exit %d, want train's flags\n%s", code, out)
	}
	for _, args := range [][]string{{"version"}, {"-version"}} {
		out, code := runStarter(t, bin, args...)
		if code != 0 || !strings.HasPrefix(out, "starter v"+buildinfo.Release) || !strings.Contains(out, "build v") {
			t.Errorf("starter %s: exit %d\n%s", args[0], code, out)
		}
	}
	out, err := exec.Command(workerBin, "-version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "worker v"+buildinfo.Release) {
		t.Errorf("worker -version: %v\n%s", err, out)
	}
}

// TestStarterResumesWithTheRunsSpec: `starter resume -id RUN` needs no spec:
// it takes RUN's own (data set, checkpoint URL, scaling) and starts from its
// latest checkpoint; `starter list` shows both runs.
func TestStarterResumesWithTheRunsSpec(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	bin := buildStarter(t)
	queue := "it-resume"
	startWorker(t, "worker-a", "both", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 1, 2)
	s.Hyper.BatchSize = 128
	first := awaitRun(t, startRun(t, c, "it-resume-1", queue, s), 3*time.Minute)
	if first.Latest == nil || first.Latest.Epoch != 2 {
		t.Fatalf("the first run's latest checkpoint: %+v", first.Latest)
	}
	conn := []string{"-address", server.Addr(), "-namespace", "default", "-control-queue", queue + "-control"}
	checkEventFiles(t, first)
	checkPlots(t, bin, conn, "it-resume-1")
	out, code := runStarter(t, bin, append([]string{"resume", "-id", "it-resume-1", "-epochs", "3", "-wait"}, conn...)...)
	if code != 0 {
		t.Fatalf("starter resume: exit %d\n%s", code, out)
	}
	m := regexp.MustCompile(`started run (it-resume-1-resumed-\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("starter resume did not say which run it started:\n%s", out)
	}
	var resumed *spec.Progress
	if err := c.GetWorkflow(context.Background(), m[1], "").Get(context.Background(), &resumed); err != nil {
		t.Fatal(err)
	}
	// It trained epoch 2 only (0 and 1 came from the checkpoint), and wrote
	// its checkpoints where the first run's spec said.
	if resumed.State != spec.StateCompleted || len(resumed.Metrics) != 1 || resumed.Metrics[0].Epoch != 2 {
		t.Fatalf("the resumed run: state %s, metrics %+v", resumed.State, resumed.Metrics)
	}
	if resumed.Latest == nil || resumed.Latest.URL != first.Latest.URL {
		t.Fatalf("the resumed run's checkpoint %+v; want it in the first run's storage %s", resumed.Latest, first.Latest.URL)
	}
	if !strings.Contains(out, "train loss") || !strings.Contains(out, "test accuracy") {
		t.Errorf("the progress line does not say which loss and accuracy it shows:\n%s", out)
	}

	// A run that does not exist is named in the refusal.
	out, code = runStarter(t, bin, append([]string{"resume", "-id", "no-such-run"}, conn...)...)
	if code == 0 || !strings.Contains(out, "no-such-run") {
		t.Errorf("starter resume of a run that does not exist: exit %d\n%s", code, out)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		out, code = runStarter(t, bin, append([]string{"list", "-n", "50"}, conn...)...)
		if code == 0 && regexp.MustCompile(`(?m)^it-resume-1 +run +completed`).MatchString(out) && strings.Contains(out, m[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("starter list does not show both runs as completed runs: exit %d\n%s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestDevserverSaysThePortIsBusy: a dev server on a port in use says which
// flag to change instead of panicking.
func TestDevserverSaysThePortIsBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	srv, err := devserver.Start(devserver.Options{Port: port, UIPort: 0})
	if err == nil {
		srv.Stop()
		t.Fatal("the dev server started on a busy port")
	}
	if !strings.Contains(err.Error(), "-port") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("busy port: %v; want the cause and the flag to change", err)
	}
}

// checkEventFiles reads the TensorBoard event files rank 0 wrote beside the
// run's checkpoints: one per epoch, with the loss of its steps and the
// epoch's metrics, every record's checksums right.
func checkEventFiles(t *testing.T, p *spec.Progress) {
	t.Helper()
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	names, err := store.EventFiles(ctx, p.Run)
	if err != nil || len(names) != p.Epoch {
		t.Fatalf("event files %v (%v); want one per epoch, %d", names, err, p.Epoch)
	}
	var losses, accuracies int
	lastStep := int64(-1)
	for _, n := range names {
		raw, err := store.ReadEvents(ctx, p.Run, n)
		if err != nil {
			t.Fatal(err)
		}
		events, err := tensorboard.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		for _, e := range events {
			if e.Step <= lastStep {
				t.Errorf("%s: step %d after step %d", n, e.Step, lastStep)
			}
			lastStep = e.Step
			if _, ok := e.Scalars["loss"]; ok {
				losses++
			}
			if _, ok := e.Scalars[spec.MetricTestAccuracy]; ok {
				accuracies++
			}
		}
	}
	if losses < 10*p.Epoch || accuracies != p.Epoch {
		t.Fatalf("event files hold %d step losses and %d test accuracies over %d epochs", losses, accuracies, p.Epoch)
	}
}

// checkPlots draws a run's accuracy by epoch (SVG) and its loss by step (PNG).
func checkPlots(t *testing.T, bin string, conn []string, id string) {
	t.Helper()
	dir := t.TempDir()
	svg, pngFile := filepath.Join(dir, "acc.svg"), filepath.Join(dir, "loss.png")
	if out, code := runStarter(t, bin, append([]string{"plot", "-id", id, "-o", svg}, conn...)...); code != 0 {
		t.Fatalf("starter plot: exit %d\n%s", code, out)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("test_accuracy")) {
		t.Fatalf("the SVG: %v\n%.300s", err, b)
	}
	if out, code := runStarter(t, bin, append([]string{"plot", "-id", id, "-x", "step", "-metric", "loss", "-o", pngFile}, conn...)...); code != 0 {
		t.Fatalf("starter plot -x step: exit %d\n%s", code, out)
	}
	f, err := os.Open(pngFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil || img.Bounds().Dx() < 300 {
		t.Fatalf("the PNG: %v", err)
	}
	if out, code := runStarter(t, bin, append([]string{"plot", "-id", id, "-metric", "accuracy"}, conn...)...); code != 2 || !strings.Contains(out, "test_accuracy") {
		t.Fatalf("starter plot -metric accuracy: exit %d, want 2 and the metrics it draws\n%s", code, out)
	}
}

// TestStarterStatusShowsTheRanksHeartbeats: while a run trains, `starter
// status` shows each running activity's latest heartbeat (the host's
// epoch: its step; on a GPU slot also the NVML readings), as the Temporal
// UI's pending activities do.
func TestStarterStatusShowsTheRanksHeartbeats(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	bin := buildStarter(t)
	queue := "it-status"
	startWorker(t, "worker-s", "both", queue)
	c := dial(t)
	// Batches of 8 make each epoch several seconds long: an epoch shorter
	// than the heartbeat interval (1 s here) ends before it beats, and on a
	// fast machine batches of 64 took 0.9 s an epoch, so status never had
	// a RunEpoch heartbeat to show.
	s := subsetSpec(t, queue, 1, 200)
	s.Hyper.BatchSize = 8
	run := startRun(t, c, "it-status-1", queue, s)
	defer c.CancelWorkflow(context.Background(), run.GetID(), "")
	conn := []string{"-address", server.Addr(), "-namespace", "default", "-id", "it-status-1"}
	beat := regexp.MustCompile(`(?m)^  RunEpoch on worker-s, heartbeat [0-9.]+m?s ago: \{.*"step":[0-9]+`)
	var out string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var code int
		if out, code = runStarter(t, bin, append([]string{"status"}, conn...)...); code == 0 && beat.MatchString(out) {
			return
		}
	}
	t.Fatalf("starter status never showed the epoch's heartbeat with its step:\n%s", out)
}
