package policy

import (
	"os"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
)

func TestResolve(t *testing.T) {
	p := Policy{StorageRoots: []string{
		"file:///var/lib/durabletrain/",
		"s3://ckpts?endpoint=http://minio:9000&region=us-east-1&use_path_style=true",
		"s3://shared?prefix=team-a/",
		"mem://",
	}}
	for _, c := range []struct{ url, want, err string }{
		{"file:///var/lib/durabletrain/checkpoints?create_dir=1", "file:///var/lib/durabletrain/checkpoints?create_dir=1", ""},
		{"file:///var/lib/durabletrain", "file:///var/lib/durabletrain", ""},
		{"file:///var/lib/durabletrain-other/x", "", "outside the storage this worker allows"},
		{"file:///etc/passwd", "", `"file:///etc/passwd" is outside the storage this worker allows (-storage-roots file:///var/lib/durabletrain/,s3://ckpts?endpoint=…&region=…&use_path_style=…`},
		{"file:///var/lib/durabletrain/x?secret_key_path=/etc/shadow", "", `sets ?"secret_key_path"=; want only create_dir, direct_io, metadata, no_tmp_dir, prefix`},
		{"s3://ckpts?prefix=run-1/", "s3://ckpts?endpoint=http%3A%2F%2Fminio%3A9000&prefix=run-1%2F&region=us-east-1&use_path_style=true", ""},
		{"s3://ckpts?endpoint=http://169.254.169.254/", "", "sets ?endpoint=, which this worker's storage root"},
		{"s3://ckpts?profile=admin", "", `sets ?"profile"=`},
		{"s3://other-bucket", "", "outside the storage"},
		{"s3://shared?prefix=team-a/runs/", "s3://shared?prefix=team-a/runs/", ""},
		{"s3://shared?prefix=team-b/", "", "outside the storage"},
		{"s3://shared", "", "outside the storage"},
		{"mem://", "mem://", ""},
		{"gs://bucket", "", "outside the storage"},
		{"file://relative/x", "", "three slashes"},
	} {
		got, err := p.Resolve("checkpoint.url", c.url)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: got %q, %v; want an error containing %q", c.url, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.url, got, err, c.want)
		}
	}
}

func TestExecIsOffUnlessAllowed(t *testing.T) {
	x := &spec.Exec{Command: []string{"python3", "train.py"}}
	if err := (Policy{}).CheckExec(x); err == nil || !strings.Contains(err.Error(), "runs no exec programs (its -allow-exec is empty)") {
		t.Fatalf("default policy: %v", err)
	}
	sh := "/bin/sh"
	for _, c := range []struct {
		allow []string
		dirs  []string
		x     spec.Exec
		ok    bool
	}{
		{[]string{"python3"}, nil, spec.Exec{Command: []string{"python3", "t.py"}}, true},
		{[]string{"python3"}, nil, spec.Exec{Command: []string{"sh", "-c", "curl evil"}}, false},
		{[]string{"python3"}, nil, spec.Exec{Command: []string{"/tmp/python3"}}, false},
		{[]string{sh}, nil, spec.Exec{Command: []string{"sh"}}, true}, // a bare name resolved on PATH to an allowed path
		{[]string{"/usr/bin/"}, nil, spec.Exec{Command: []string{"/usr/bin/../../tmp/x"}}, false},
		{[]string{"/opt/jobs/"}, nil, spec.Exec{Command: []string{"/opt/jobs/train"}}, true},
		{[]string{"*"}, nil, spec.Exec{Command: []string{"/anything"}}, true},
		{[]string{"python3"}, nil, spec.Exec{Command: []string{"python3"}, Dir: "/home/me"}, false},
		{[]string{"python3"}, []string{"/srv/jobs"}, spec.Exec{Command: []string{"python3"}, Dir: "/srv/jobs/a"}, true},
		{[]string{"python3"}, []string{"/srv/jobs"}, spec.Exec{Command: []string{"python3"}, Dir: "/srv/jobs/../../etc"}, false},
	} {
		err := Policy{Exec: c.allow, ExecDirs: c.dirs}.CheckExec(&c.x)
		if (err == nil) != c.ok {
			t.Errorf("allow %v dirs %v, exec %+v: got %v", c.allow, c.dirs, c.x, err)
		}
	}
}

// An exec program gets the variables the worker passes, never its secrets.
func TestEnvironKeepsTheWorkersSecrets(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
	t.Setenv("TEMPORAL_API_KEY", "key")
	env := strings.Join(Policy{}.Environ(), "\n")
	if strings.Contains(env, "hunter2") || strings.Contains(env, "TEMPORAL_API_KEY") || !strings.Contains(env, "PATH="+os.Getenv("PATH")) {
		t.Fatalf("environment passed:\n%s", env)
	}
	if env := (Policy{PassEnv: []string{"TEMPORAL_API_KEY"}}).Environ(); len(env) != 1 || env[0] != "TEMPORAL_API_KEY=key" {
		t.Fatalf("-exec-pass-env: %v", env)
	}
}

// The worker's NCCL and gloo settings reach every program, and a spec may
// not set them itself.
func TestWorkerSetsTheCollectiveEnvironment(t *testing.T) {
	p := Policy{Exec: []string{"*"}, ProgramEnv: NCCLEnv("ib0", "eth1", true)}
	env := strings.Join(p.Environ(), " ")
	for _, want := range []string{"NCCL_SOCKET_IFNAME=ib0", "GLOO_SOCKET_IFNAME=eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_ASYNC_ERROR_HANDLING=1"} {
		if !strings.Contains(env, want) {
			t.Errorf("environment %s lacks %s", env, want)
		}
	}
	if env := strings.Join(NCCLEnv("", "", false), " "); env != "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 NCCL_ASYNC_ERROR_HANDLING=0" {
		t.Errorf("no interfaces, no async errors: %s", env)
	}
	err := p.CheckExec(&spec.Exec{Command: []string{"python3"}, Env: map[string]string{"NCCL_SOCKET_IFNAME": "lo"}})
	if err == nil || !strings.Contains(err.Error(), "exec.env.NCCL_SOCKET_IFNAME") {
		t.Fatalf("a spec setting the worker's NCCL interface: %v", err)
	}
	if err := p.CheckExec(&spec.Exec{Command: []string{"python3"}, Env: map[string]string{"NCCL_DEBUG": "INFO"}}); err != nil {
		t.Fatalf("a spec setting NCCL_DEBUG: %v", err)
	}
}

func TestRankMemory(t *testing.T) {
	if m := (Policy{MaxRankMemory: 1 << 30}).RankMemory(4); m != 1<<30 {
		t.Fatalf("flag: %d", m)
	}
	if m := (Policy{}).RankMemory(2); m < 64<<20 || m > workerMemory() {
		t.Fatalf("default for 2 slots: %d of %d", m, workerMemory())
	}
}

func TestDatasetMemory(t *testing.T) {
	if m := (Policy{MaxDatasetMemory: 1 << 30}).DatasetMemory(); m != 1<<30 {
		t.Fatalf("flag: %d", m)
	}
	if m := (Policy{}).DatasetMemory(); m != max(1, workerMemory()/4) {
		t.Fatalf("default: %d; want a quarter of %d", m, workerMemory())
	}
}

// A spec may not set what the dynamic loader reads: with LD_PRELOAD or
// LD_LIBRARY_PATH it would run code of its choosing inside a program the
// worker allows, even one that is no interpreter. Everything else passes.
func TestSpecMayNotSteerTheDynamicLoader(t *testing.T) {
	p := Policy{Exec: []string{"/usr/local/bin/train"}}
	for _, name := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "NLSPATH"} {
		err := p.CheckExec(&spec.Exec{Command: []string{"/usr/local/bin/train"}, Env: map[string]string{"OMP_NUM_THREADS": "4", name: "/tmp/x"}})
		if err == nil || !strings.Contains(err.Error(), "exec.env."+name) || !strings.Contains(err.Error(), "dynamic loader") {
			t.Errorf("exec.env.%s: %v", name, err)
		}
	}
	for _, name := range []string{"OMP_NUM_THREADS", "TMPDIR", "MY_LD_FLAG", "CUDA_HOME"} {
		if err := p.CheckExec(&spec.Exec{Command: []string{"/usr/local/bin/train"}, Env: map[string]string{name: "x"}}); err != nil {
			t.Errorf("exec.env.%s: %v", name, err)
		}
	}
}

// -storage-roots takes URLs and absolute paths, split only where a new root
// starts, and refuses a root that could never match instead of skipping it.
func TestParseStorageRoots(t *testing.T) {
	for in, want := range map[string][]string{
		"file:///var/lib/durabletrain/,file:///usr/share/datasets/,mem://": {"file:///var/lib/durabletrain/", "file:///usr/share/datasets/", "mem://"},
		"/home/me/My Runs,2/, /usr/share/datasets/":                        {"file:///home/me/My%20Runs%2C2/", "file:///usr/share/datasets/"},
		"s3://ckpts?endpoint=http://minio:9000&region=us-east-1,/data/":    {"s3://ckpts?endpoint=http://minio:9000&region=us-east-1", "file:///data/"},
		"s3://abc?prefix=x,y/, mem://":                                     {"s3://abc?prefix=x,y/", "mem://"},
	} {
		got, err := ParseStorageRoots("-storage-roots", in)
		if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("ParseStorageRoots(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"":                          "-storage-roots is \"\"; want at least one blob URL or absolute path",
		" , ":                       "want at least one",
		"relative/x,/data/":         "-storage-roots's root 1 is \"relative/x\"; want an absolute path on the workers",
		"/data/,file://data/x":      "-storage-roots's root 2 is \"file://data/x\"; want file:///absolute/path (three slashes",
		"ftp://host/x":              "-storage-roots's root 1 is \"ftp://host/x\"; want a URL with scheme",
		"s3://Bad_Bucket":           "-storage-roots's root 1",
		"mem://,s3://b?prefix=%zz/": "-storage-roots's root 2",
	} {
		if got, err := ParseStorageRoots("-storage-roots", in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseStorageRoots(%q) = %q, %v; want an error containing %q", in, got, err, msg)
		}
	}
	// A root given as a path holds the spec URLs a starter makes of paths below it.
	roots, err := ParseStorageRoots("-storage-roots", "/home/me/My Runs,2/")
	if err != nil {
		t.Fatal(err)
	}
	url := "file:///home/me/My%20Runs%2C2/ckpt%23a?create_dir=1"
	if got, err := (Policy{StorageRoots: roots}).Resolve("checkpoint.url", url); err != nil || got != url {
		t.Errorf("Resolve(%s) under %q = %q, %v", url, roots, got, err)
	}
}

// An embedder's roots are checked as the worker's flag is: a root that
// could never match is an error, not a silent refusal of every spec.
func TestCheckRoots(t *testing.T) {
	if err := (Policy{StorageRoots: DefaultStorageRoots}).CheckRoots(); err != nil {
		t.Errorf("DefaultStorageRoots: %v", err)
	}
	err := (Policy{StorageRoots: []string{"mem://", "/var/lib/x"}}).CheckRoots()
	if err == nil || !strings.Contains(err.Error(), `StorageRoots[1] (worker -storage-roots) is "/var/lib/x"; want a blob URL`) {
		t.Errorf("a bare path among the roots: %v", err)
	}
	_, err = Policy{StorageRoots: []string{"/var/lib/x/"}}.Resolve("checkpoint.url", "file:///var/lib/x/ckpt")
	if err == nil || !strings.Contains(err.Error(), "misconfigured: StorageRoots[0] (worker -storage-roots) is") {
		t.Errorf("a spec under a malformed root: %v; want the root named", err)
	}
}
