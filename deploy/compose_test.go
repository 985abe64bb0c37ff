package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// TestComposeTrainsAcrossContainers builds the image from our binaries,
// brings up docker-compose.local.yml (dev server, a workflow worker and two
// GPU agents, each its own container on a private network), trains 2 ranks
// for 3 epochs on the full Fashion-MNIST through the starter in a fifth
// container, and tears it all down. It skips where no Docker engine answers.
func TestComposeTrainsAcrossContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and starts containers")
	}
	t.Parallel() // beside the PyTorch one, on the images they share
	needDocker(t)
	tag, _ := buildImages(t)
	compose := upCompose(t, fmt.Sprintf("dte2e%d", os.Getpid()), nil, []string{"DURABLETRAIN_IMAGE=" + tag},
		"starter", "devserver", "workflows", "agent-1", "agent-2")
	start := time.Now()
	out := run(t, compose("run", "--rm", "starter", "train", "-id", "e2e", "-workers", "2", "-epochs", "3", "-wait"))
	t.Logf("trained in %v:\n%s", time.Since(start).Round(time.Millisecond), lastLines(out, 4))

	var p spec.Progress
	status := run(t, compose("run", "--rm", "starter", "status", "-id", "e2e", "-json"))
	if err := json.Unmarshal([]byte(status[strings.Index(status, "{"):]), &p); err != nil {
		t.Fatalf("starter status -json: %v\n%s", err, status)
	}
	if p.State != spec.StateCompleted || p.Epoch != 3 || len(p.Metrics) != 3 || p.Failures != 0 {
		t.Fatalf("progress %+v", p)
	}
	if acc := p.Metrics[2].TestAccuracy; acc < 0.80 {
		t.Fatalf("test accuracy %.4f after 3 epochs; want at least 0.80", acc)
	}
	if p.Latest == nil || p.Latest.Epoch != 3 {
		t.Fatalf("latest checkpoint %+v", p.Latest)
	}
	// The checkpoints are on the agents' shared volume, verified by their manifests.
	cps := run(t, compose("exec", "-T", "agent-1", "/usr/local/bin/starter", "checkpoints", "-address", "devserver:7233", "-id", "e2e"))
	if !strings.Contains(cps, "ckpt-e000003-s000000000") || strings.Contains(cps, "NOT USABLE") {
		t.Fatalf("checkpoints seen from agent-1:\n%s", cps)
	}
}

// The images both compose tests run, built once by build-images.sh: with
// PYTORCH=1 it builds both from one set of binaries (two builds side by side
// compiled and linked the same three binaries twice, minutes on a 2-core
// machine). Where /usr/bin/python3 cannot import torch it builds our image
// alone, so the first test still runs, and the PyTorch one fails saying why.
var images struct {
	once       sync.Once
	tag, pytag string // pytag is "" where PyTorch is missing
	out        string
	err        error
}

// buildImages returns the tags of the image of our binaries and of the
// PyTorch image ("" where this machine has no PyTorch), building them on the
// first call; TestMain removes them.
func buildImages(t *testing.T) (tag, pytag string) {
	t.Helper()
	images.once.Do(func() {
		images.tag = fmt.Sprintf("durabletrain:e2e-%d", os.Getpid())
		env := []string{"TAG=" + images.tag}
		if exec.Command("/usr/bin/python3", "-c", "import torch").Run() == nil {
			images.pytag = fmt.Sprintf("durabletrain-pytorch:e2e-%d", os.Getpid())
			env = append(env, "PYTORCH=1", "TAG_PYTORCH="+images.pytag)
		}
		cmd := exec.Command("./build-images.sh")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		images.out = string(out)
		if err != nil {
			images.err = fmt.Errorf("./build-images.sh %s: %v\n%s", strings.Join(env, " "), err, out)
		}
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
	t.Logf("%s", lastLines(images.out, 3))
	return images.tag, images.pytag
}

func TestMain(m *testing.M) {
	code := m.Run()
	if images.tag != "" {
		exec.Command("docker", "rmi", "-f", images.tag).Run()
	}
	if images.pytag != "" {
		exec.Command("docker", "rmi", "-f", images.pytag).Run()
	}
	os.Exit(code)
}

// needDocker skips a test where no Docker engine or docker-compose answers.
func needDocker(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (docker info: %v: %s): skipping the compose test", err, strings.TrimSpace(string(out)))
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skip("docker-compose is not installed: skipping the compose test")
	}
}

// upCompose brings up services of docker-compose.local.yml as project
// (flags such as a profile, env such as the images), takes them down with
// their volumes when the test ends (with the containers' logs if it
// failed), and waits until the dev server answers the starter service. It
// returns the docker-compose command of the project.
func upCompose(t *testing.T, project string, flags, env []string, starter string, services ...string) func(args ...string) *exec.Cmd {
	t.Helper()
	compose := func(args ...string) *exec.Cmd {
		cmd := exec.Command("docker-compose", append(append([]string{"-p", project, "-f", "../docker-compose.local.yml"}, flags...), args...)...)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := compose("logs", "--no-color", "--tail", "40").CombinedOutput()
			t.Logf("container logs:\n%s", out)
		}
		if out, err := compose("down", "-v", "--remove-orphans").CombinedOutput(); err != nil {
			t.Logf("docker-compose down: %v\n%s", err, out)
		}
	})
	run(t, compose(append([]string{"up", "-d"}, services...)...))
	// The workers restart until the dev server answers; so does the starter here.
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, err := compose("run", "--rm", starter, "list").CombinedOutput()
		if err == nil {
			return compose
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dev server never answered the starter: %v\n%s", err, out)
		}
		time.Sleep(2 * time.Second)
	}
}

func run(t *testing.T, cmd *exec.Cmd, env ...string) string {
	t.Helper()
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return string(out)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestComposeTrainsPyTorchAcrossContainers builds the PyTorch image (our
// binaries with Debian's python3-torch, PYTORCH=1 build-images.sh), brings
// up the dev server, a workflow worker and the two PyTorch agents of
// docker-compose.local.yml (profile "pytorch"), and trains
// examples/pytorch/compose.json: the PyTorch example as an exec run of 2
// ranks, one per container, DDP over gloo between them, 2 epochs on the
// full Fashion-MNIST.
func TestComposeTrainsPyTorchAcrossContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images and starts containers")
	}
	t.Parallel()
	needDocker(t)
	raw, err := os.ReadFile("../examples/pytorch/compose.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spec.Parse(raw); err != nil {
		t.Fatalf("examples/pytorch/compose.json: %v", err)
	}
	tag, pytag := buildImages(t)
	if pytag == "" {
		t.Fatal("/usr/bin/python3 cannot import torch, so there is no PyTorch image: make deps-test installs Debian's python3-torch")
	}
	compose := upCompose(t, fmt.Sprintf("dte2epy%d", os.Getpid()), []string{"--profile", "pytorch"},
		[]string{"DURABLETRAIN_IMAGE=" + tag, "DURABLETRAIN_PYTORCH_IMAGE=" + pytag}, "starter-py", "devserver", "workflows", "agent-py-1", "agent-py-2")
	start := time.Now()
	out := run(t, compose("run", "--rm", "starter-py", "train", "-id", "e2e-py", "-f", "/usr/local/share/durabletrain/examples/pytorch/compose.json", "-wait"))
	t.Logf("trained in %v:\n%s", time.Since(start).Round(time.Millisecond), lastLines(out, 4))
	var p spec.Progress
	status := run(t, compose("run", "--rm", "starter-py", "status", "-id", "e2e-py", "-json"))
	if err := json.Unmarshal([]byte(status[strings.Index(status, "{"):]), &p); err != nil {
		t.Fatalf("starter status -json: %v\n%s", err, status)
	}
	if p.State != spec.StateCompleted || p.Epoch != 2 || len(p.Metrics) != 2 || p.Failures != 0 || p.Latest == nil {
		t.Fatalf("progress %+v", p)
	}
	// Each rank ran in its own container: the gang's two hosts are the two agents.
	logs := run(t, compose("logs", "--no-color", "agent-py-1", "agent-py-2"))
	for _, agent := range []string{"agent-py-1", "agent-py-2"} {
		if !strings.Contains(logs, agent) || !strings.Contains(logs, `"rank"`) {
			t.Fatalf("no rank of the run in %s's log:\n%s", agent, lastLines(logs, 20))
		}
	}
	if acc := p.Metrics[1].TestAccuracy; acc < 0.80 {
		t.Fatalf("test accuracy %.4f after 2 epochs; want at least 0.80", acc)
	}
	t.Logf("2 epochs of the PyTorch example across two containers: test accuracy %.4f", p.Metrics[1].TestAccuracy)
}
