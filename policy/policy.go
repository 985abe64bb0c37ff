// Package policy owns what a GPU worker lets a training spec make it do:
// which programs the exec backend may start, in which directories, with
// which of the worker's own environment variables; which storage a spec's
// dataset, checkpoint and results URLs may name, with which query
// parameters; how much memory one rank may take. The worker's flags set it
// and no spec can widen it: whoever can start a workflow in the namespace
// gets exactly what the workers allow, no more.
package policy

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"github.com/durabletrain/durabletrain/internal/strictjson"
	"github.com/durabletrain/durabletrain/spec"
)

// Policy is one worker's.
type Policy struct {
	// Exec lists the programs exec.command[0] may be: absolute paths
	// (what a bare name resolves to on the worker's PATH is checked against
	// them), bare names (allowed as written, resolved on PATH), or
	// directories ending in "/" (any program under them). "*" allows any
	// program. Empty: the exec backend is off.
	Exec []string
	// ExecDirs lists the directories exec.dir may be or be under. Empty:
	// exec.dir must be left out (the program runs in its scratch directory).
	ExecDirs []string
	// PassEnv names the worker's own environment variables an exec program
	// also gets; default DefaultPassEnv. Everything else of the worker's
	// environment (cloud credentials, tokens) stays with the worker.
	PassEnv []string
	// ProgramEnv is what the worker sets for every exec program, as
	// "NAME=value" (cmd/worker's -nccl-socket-ifname, -gloo-socket-ifname,
	// -nccl-async-error-handling: the host's network and NCCL settings).
	// A spec's exec.env may not set these names.
	ProgramEnv []string
	// StorageRoots are the blob URLs the spec's URLs must fall under;
	// default DefaultStorageRoots. A root's query parameters (an S3
	// endpoint, a region, a profile) are the worker's: they are added to
	// the spec's URL, and a spec cannot set them itself.
	StorageRoots []string
	// MaxRankMemory bounds the memory one rank's model may take, in bytes;
	// 0: DefaultRankMemory(slots).
	MaxRankMemory int64
	// MaxDatasetMemory bounds the memory one data set's examples may take
	// (both splits, as the trainer holds them), in bytes; 0: a quarter of
	// the worker's memory (DatasetMemory). A data set is loaded once per
	// worker and shared by its ranks.
	MaxDatasetMemory int64
	// StorageStallTimeout is how long a call to blob storage (a
	// checkpoint's object written or read, a listing, a data set's file)
	// may move nothing before it fails as the store's fault, and the gang
	// re-forms; 0: blobwatch.DefaultStallTimeout (2 minutes).
	StorageStallTimeout time.Duration
	// Trackers lists the MLflow tracking servers a spec's mlflow.tracking_uri
	// may name (CheckTracker): http(s) URLs, or "*" for any. Empty: none.
	Trackers []string
}

// StorageContext is ctx for opening blob storage under this policy: its
// buckets fail a call that moves nothing for StorageStallTimeout.
func (p Policy) StorageContext(ctx context.Context) context.Context {
	return blobwatch.WithStallTimeout(ctx, p.StorageStallTimeout)
}

// DefaultStorageRoots: the default data set and checkpoint directories, and memory.
var DefaultStorageRoots = []string{"file:///var/lib/durabletrain/", "file:///usr/share/datasets/", "mem://"}

// DefaultPassEnv are the worker's variables every exec program gets.
// LD_LIBRARY_PATH and CUDA_HOME are among them: GPU images (NVIDIA's
// containers among them) set them, and some find the driver's libcuda and
// CUDA's libraries only through them. They are the worker's own; a spec
// may not set LD_LIBRARY_PATH (CheckExec).
var DefaultPassEnv = []string{"PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR",
	"LD_LIBRARY_PATH", "CUDA_HOME", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_IB_DISABLE", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}

// safeParams are the query parameters a spec may set itself, by scheme:
// none of them reads a file, picks an identity, or sends a request elsewhere.
var safeParams = map[string][]string{
	"file":   {"create_dir", "direct_io", "metadata", "no_tmp_dir", "prefix"},
	"s3":     {"prefix", "region"},
	"gs":     {"prefix"},
	"azblob": {"prefix"},
	"mem":    {"prefix"},
}

// Error is a spec the policy refuses: a user error (no retry will change it).
type Error struct{ msg string }

func (e *Error) Error() string { return e.msg }

func refuse(format string, args ...any) error { return &Error{fmt.Sprintf(format, args...)} }

// CheckSpec refuses a spec this worker will not run, naming the field and
// the flag that would allow it.
func (p Policy) CheckSpec(s spec.Training) error {
	if s.Exec != nil || s.Trainer == spec.TrainerExec {
		if err := p.CheckExec(s.Exec); err != nil {
			return err
		}
	}
	if _, err := p.Resolve("dataset.url", s.Dataset.URL); err != nil {
		return err
	}
	if _, err := p.Resolve("checkpoint.url", s.Checkpoint.URL); err != nil {
		return err
	}
	return nil
}

// CheckExec refuses a program, or a directory, the worker does not allow.
func (p Policy) CheckExec(x *spec.Exec) error {
	if len(p.Exec) == 0 {
		return refuse("exec: this worker runs no exec programs (its -allow-exec is empty)")
	}
	if x == nil || len(x.Command) == 0 {
		return refuse("exec.command is empty")
	}
	prog := x.Command[0]
	if !p.programAllowed(prog) {
		return refuse("exec.command[0] %s is not a program this worker allows (-allow-exec %s)", quoted(prog), strings.Join(p.Exec, ","))
	}
	if x.Dir != "" && !slices.ContainsFunc(p.ExecDirs, func(d string) bool { return under(filepath.Clean(x.Dir), filepath.Clean(d)) }) {
		return refuse("exec.dir %s is not under a directory this worker allows (-exec-dirs %s)", quoted(x.Dir), strings.Join(p.ExecDirs, ","))
	}
	for _, name := range slices.Sorted(maps.Keys(x.Env)) {
		if loaderVariable(name) {
			return refuse("exec.env.%s: the dynamic loader reads it, and a spec may not choose what code an allowed program loads; leave it out (a library path the program needs is the worker's to give: -exec-pass-env)", name)
		}
	}
	for _, kv := range p.ProgramEnv {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := x.Env[name]; ok {
			return refuse("exec.env.%s: this worker sets %s itself (its NCCL and gloo flags: the host's network is the worker's to say); leave it out", name, name)
		}
	}
	return nil
}

func (p Policy) programAllowed(prog string) bool {
	if slices.Contains(p.Exec, "*") {
		return true
	}
	resolved := prog
	if !strings.Contains(prog, "/") {
		if slices.Contains(p.Exec, prog) {
			return true // a bare name the worker lists, as written
		}
		lp, err := exec.LookPath(prog)
		if err != nil {
			return false
		}
		resolved = lp
	}
	if !filepath.IsAbs(resolved) {
		return false
	}
	resolved = filepath.Clean(resolved)
	real := realPath(resolved)
	for _, a := range p.Exec {
		if !filepath.IsAbs(a) {
			continue
		}
		dir := filepath.Clean(a)
		switch {
		case strings.HasSuffix(a, "/"):
			if (under(resolved, dir) && resolved != dir) || (under(real, realPath(dir)) && real != realPath(dir)) {
				return true
			}
		case resolved == dir || real == realPath(dir):
			return true
		}
	}
	return false
}

// loaderVariable says whether the C library loads code, or reads files it
// then trusts, on the variable's word: the dynamic loader's LD_* (LD_PRELOAD,
// LD_LIBRARY_PATH, LD_AUDIT, ...) and the others glibc removes from a setuid
// program's environment for that reason (its UNSECURE_ENVVARS), but TMPDIR.
// Set by a spec, they would run code of the spec's choosing inside any
// program the worker allows, not only inside interpreters.
func loaderVariable(name string) bool {
	if strings.HasPrefix(name, "LD_") {
		return true
	}
	switch name {
	case "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
		"NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR":
		return true
	}
	return false
}

// realPath is p with its symbolic links resolved, or p if it cannot be.
func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// Environ is the part of the worker's environment an exec program gets.
func (p Policy) Environ() []string {
	pass := p.PassEnv
	if pass == nil {
		pass = DefaultPassEnv
	}
	var env []string
	for _, k := range pass {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, p.ProgramEnv...)
}

// NCCLEnv is ProgramEnv for a host's collective settings: the network
// interface NCCL and gloo use ("" leaves each to its own choice), and
// whether NCCL's errors and timeouts abort a hung collective (PyTorch reads
// TORCH_NCCL_ASYNC_ERROR_HANDLING from 2.2, NCCL_ASYNC_ERROR_HANDLING before).
func NCCLEnv(ncclIfname, glooIfname string, asyncErrors bool) []string {
	var env []string
	if ncclIfname != "" {
		env = append(env, "NCCL_SOCKET_IFNAME="+ncclIfname)
	}
	if glooIfname != "" {
		env = append(env, "GLOO_SOCKET_IFNAME="+glooIfname)
	}
	v := "0"
	if asyncErrors {
		v = "1"
	}
	return append(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING="+v, "NCCL_ASYNC_ERROR_HANDLING="+v)
}

// Resolve checks a spec's blob URL against the storage roots and returns
// the URL to open: the spec's, with its root's query parameters added. A
// parameter outside the safe set is refused unless the root sets it.
func (p Policy) Resolve(field, raw string) (string, error) {
	if err := spec.CheckURL(field, raw); err != nil {
		return "", refuse("%v", err)
	}
	u, _ := url.Parse(raw)
	roots := p.StorageRoots
	if roots == nil {
		roots = DefaultStorageRoots
	}
	for _, r := range roots {
		root, err := url.Parse(r)
		if err != nil || !within(u, root) {
			continue
		}
		q, rq := u.Query(), root.Query()
		for k := range q {
			if _, fixed := rq[k]; fixed && k != "prefix" {
				return "", refuse("%s sets ?%s=, which this worker's storage root %s fixes; leave it out", field, k, quoted(redact(root)))
			}
			if !slices.Contains(safeParams[u.Scheme], k) {
				return "", refuse("%s sets ?%s=; want only %s (the worker's storage roots set the rest)", field, quoted(k), strings.Join(safeParams[u.Scheme], ", "))
			}
		}
		if p := rq.Get("prefix"); p != "" && !strings.HasPrefix(q.Get("prefix"), p) {
			continue // the root is a prefix of a bucket: the spec's must be under it
		}
		added := false
		for k, v := range rq {
			if k != "prefix" {
				q[k], added = v, true
			}
		}
		if !added {
			return raw, nil
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	var shown []string
	for _, r := range roots {
		if ru, err := url.Parse(r); err == nil {
			shown = append(shown, redact(ru))
		}
	}
	if err := (Policy{StorageRoots: roots}).CheckRoots(); err != nil {
		// An embedder's root that never matches: say so, not only that the URL is outside.
		return "", refuse("%s %s is outside the storage this worker allows, and this worker is misconfigured: %v", field, quoted(raw), err)
	}
	return "", refuse("%s %s is outside the storage this worker allows (-storage-roots %s)", field, quoted(raw), strings.Join(shown, ","))
}

// CheckRoots refuses storage roots that could never hold a spec's URL (a
// root that does not parse, or names no absolute path or bucket): Resolve
// would pass over such a root without a word, and every spec meant for it
// would be refused as outside the worker's storage. It names the root by
// its place in StorageRoots.
func (p Policy) CheckRoots() error {
	for i, r := range p.StorageRoots {
		if err := bloburl.Check(fmt.Sprintf("StorageRoots[%d] (worker -storage-roots)", i), r); err != nil {
			return err
		}
	}
	return nil
}

// ParseStorageRoots reads a worker's -storage-roots: blob URLs, or absolute
// local paths (taken as their file:// URLs), separated by commas. A comma
// starts a new root only where a URL ("scheme://") or a path ("/") follows
// it, so that a root's query may hold commas of its own; a path with ",/" in
// it must be written as its file:// URL. Each root must pass the same check
// as a spec's URL: a malformed root is an error naming it, not a root that
// silently matches nothing.
func ParseStorageRoots(flag, v string) ([]string, error) {
	var roots []string
	start := 0
	for _, m := range rootStart.FindAllStringIndex(v, -1) {
		roots = append(roots, strings.TrimSpace(v[start:m[0]]))
		start = m[0] + 1
	}
	roots = append(roots, strings.TrimSpace(v[start:]))
	out := roots[:0]
	for i, r := range roots {
		if strings.Trim(r, ", ") == "" {
			continue // "a,,b" or a trailing comma
		}
		u, err := bloburl.FromFlag(fmt.Sprintf("%s's root %d", flag, i+1), r)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s is %s; want at least one blob URL or absolute path, such as %s", flag, quoted(v), strings.Join(DefaultStorageRoots, ","))
	}
	return out, nil
}

var rootStart = regexp.MustCompile(`,\s*(?:[a-z][a-z0-9+.-]*://|/)`)

// within says whether u falls under root: same scheme and bucket (host),
// and for file:// a path at or under the root's.
func within(u, root *url.URL) bool {
	if u.Scheme != root.Scheme {
		return false
	}
	switch u.Scheme {
	case "file":
		return under(path.Clean(u.Path), path.Clean(root.Path))
	case "mem":
		return true
	}
	return u.Host == root.Host
}

// under says whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// redact shows a root without the values of its query parameters (an
// endpoint or a profile is the worker's business).
func redact(u *url.URL) string {
	if u.RawQuery == "" {
		return u.Scheme + "://" + u.Host + u.Path
	}
	c := *u
	q := c.Query()
	for k := range q {
		q[k] = []string{"…"}
	}
	c.RawQuery = q.Encode()
	s := c.String()
	return strings.ReplaceAll(s, "%E2%80%A6", "…")
}

// quoted shows a user's string in an error, bounded.
func quoted(s string) string { return strictjson.Quote(s) }
