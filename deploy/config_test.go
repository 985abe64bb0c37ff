package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDeploymentIsClosedByDefault checks docker-compose.yml as compose
// resolves it, with the secrets deploy/make-secrets.sh writes: every
// published port is bound to 127.0.0.1, every image is pinned to a release,
// no password is written in the file, and without .env compose refuses to
// start instead of using a default password.
func TestDeploymentIsClosedByDefault(t *testing.T) {
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skip("docker-compose is not installed: skipping")
	}
	dir := t.TempDir()
	raw, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "docker-compose.yml"), raw, 0o644)
	os.MkdirAll(filepath.Join(dir, "deploy"), 0o755)
	script, _ := os.ReadFile("make-secrets.sh")
	os.WriteFile(filepath.Join(dir, "deploy", "make-secrets.sh"), script, 0o755)

	config := func() (string, error) {
		cmd := exec.Command("docker-compose", "config")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := config(); err == nil || !strings.Contains(out, "POSTGRES_PASSWORD") {
		t.Fatalf("compose without .env: %v\n%s\nwant a refusal naming the missing password", err, out)
	}
	if out, err := exec.Command("sh", filepath.Join(dir, "deploy", "make-secrets.sh")).CombinedOutput(); err != nil {
		t.Fatalf("make-secrets.sh: %v\n%s", err, out)
	}
	for _, f := range []string{".env", "deploy/secrets/pool.key", "deploy/secrets/codec.key"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s: %v (mode %v); want it readable by its owner only", f, err, st.Mode())
		}
	}
	out, err := config()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	for _, line := range regexp.MustCompile(`(?m)^.*(?:host_ip|ports|published).*$`).FindAllString(out, -1) {
		if strings.Contains(line, "0.0.0.0") {
			t.Errorf("a port is published on every interface: %s", strings.TrimSpace(line))
		}
	}
	if strings.Count(string(raw), "127.0.0.1:") < 3 {
		t.Errorf("want Temporal, the UI and MinIO's console bound to 127.0.0.1")
	}
	for _, image := range regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllStringSubmatch(out, -1) {
		name := image[1]
		if strings.HasPrefix(name, "durabletrain:") || strings.Contains(name, "${") {
			continue // built here
		}
		_, tag, _ := strings.Cut(name, ":")
		floating := tag == "" || tag == "latest" || regexp.MustCompile(`^\d+$`).MatchString(tag) ||
			strings.HasPrefix(name, "temporalio/") && !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(tag)
		if floating {
			t.Errorf("image %s is not pinned to a release", name)
		}
	}
	for _, weak := range []string{"durabletrain-secret", "PASSWORD: temporal", "PWD: temporal"} {
		if strings.Contains(string(raw), weak) {
			t.Errorf("docker-compose.yml still holds the password %q", weak)
		}
	}
}
