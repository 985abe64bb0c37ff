// Package exectrainer owns the exec backend: each rank is the user's own
// training program (for example `python3 train.py --lr 0.001`), started once
// per gang with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, TORCHELASTIC_*,
// MASTER_ADDR, MASTER_PORT) and CUDA_VISIBLE_DEVICES from the rank's slot, so
// torch.distributed works unchanged, and driven over a local control socket
// (protocol.go) by the Python module in python/durabletrain: epoch by epoch,
// and within an epoch between steps, at steps the gang's workers agree on
// over the gang's collective, so that every rank's program stops, saves and
// resumes at the same step. The checkpoint directory the program reports is
// saved as the checkpoint's objects, and restored into a directory before
// the program starts.
package exectrainer

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Config is one rank's program.
type Config struct {
	Command []string          // the program and its arguments
	Dir     string            // its working directory; "": its scratch directory (never the worker's own)
	Env     map[string]string // extra environment
	// Environ is the worker's environment the program starts from (the
	// worker's policy decides it); nil: only PATH, HOME and LANG. The
	// worker's own secrets never reach a program unless listed here.
	Environ    []string
	Rank       int
	World      int
	LocalRank  int
	LocalWorld int    // ranks on this host (LOCAL_WORLD_SIZE)
	GroupRank  int    // this host's index in the gang (GROUP_RANK, NODE_RANK)
	GroupWorld int    // hosts in the gang (GROUP_WORLD_SIZE)
	RunID      string // TORCHELASTIC_RUN_ID: the run's name
	Restarts   int    // TORCHELASTIC_RESTART_COUNT: gangs formed before this one
	MasterAddr string // rank 0's host
	MasterPort int    // a free port there, the same for every rank
	Devices    string // CUDA_VISIBLE_DEVICES; "" leaves it unset
	Epochs     int    // the run's epochs, for DURABLETRAIN_EPOCHS
	// Hyper is the run's config (spec.Config.JSON), for DURABLETRAIN_CONFIG:
	// a trial's hyperparameters; "" is "{}".
	Hyper   string
	Scratch string // a directory of the rank's own: control socket, restored and saved checkpoints
	// Saves: this rank's Save is called (rank 0 of a run), so it copies each
	// checkpoint directory the program reports. Other ranks skip the copy,
	// which for a large model is the cost of the checkpoint itself.
	Saves      bool
	PythonPath string // where the durabletrain Python module is; prepended to PYTHONPATH
	Log        *zap.Logger
	// StartTimeout bounds how long the program may take to connect; default 2m.
	StartTimeout time.Duration
	// Comm is the gang's collective, over which the ranks' workers agree
	// where the programs stop (see TrainEpoch); nil: a gang of one.
	Comm trainer.Reducer
	// SyncEvery is about how often, in training time, the gang's programs
	// stop between two steps to agree whether to go on (default 100ms): the
	// most a preempted gang trains on before it stops, and one small
	// all-reduce each time. 1ns: after every step.
	SyncEvery time.Duration
	// VoteTimeout bounds how long a rank waits at a step for the gang's
	// other ranks to reach it (default 10m, or 20 times the slowest stretch
	// between two agreements, if longer): a program whose ranks report at
	// different steps fails instead of waiting forever.
	VoteTimeout time.Duration
}

// Trainer drives one rank's program.
type Trainer struct {
	cfg    Config
	cursor trainer.Cursor

	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	conn    net.Conn
	in      *inbox
	tail    *tailBuffer

	// paused: the program waits between two steps for word to go on (it
	// stopped at a step the gang agreed on, and saved there).
	paused bool
	epoch  epochPace

	last     message // the last epoch's report
	savedDir string  // a copy of the last checkpoint directory the program reported
	saved    trainer.Cursor
	sockDir  string // a short directory for the control socket, when Scratch is too deep
}

var _ trainer.Trainer = (*Trainer)(nil)

// stateObject lists a saved checkpoint's files and the cursor.
const stateObject = "exec-state.json"

type state struct {
	Cursor trainer.Cursor    `json:"cursor"`
	Files  map[string]string `json:"files"` // relative path -> SHA-256
	// Objects names the object of each file whose path is no object name
	// (checkpoint.ValidObjectName: a space, a letter beyond ASCII, a long
	// name): renamedPrefix and a number. Every other file's is "files/"
	// and its path.
	Objects map[string]string `json:"objects,omitempty"`
}

// renamedPrefix begins the object names of files whose paths are not object names.
const renamedPrefix = "renamed/"

// objectOf is the object that holds the file at relative path rel.
func (st state) objectOf(rel string) string { return cmp.Or(st.Objects[rel], "files/"+rel) }

// New checks the config; the program starts at Init or Restore.
func New(cfg Config) (*Trainer, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("exec trainer: exec.command is empty; want the program and its arguments, e.g. [\"python3\", \"train.py\"]")
	}
	if cfg.Scratch == "" {
		return nil, errors.New("exec trainer: no scratch directory")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.Comm == nil {
		cfg.Comm = trainer.Local{}
	}
	if cfg.SyncEvery == 0 {
		cfg.SyncEvery = 100 * time.Millisecond
	}
	if cfg.VoteTimeout == 0 {
		cfg.VoteTimeout = 10 * time.Minute
	}
	if err := os.MkdirAll(cfg.Scratch, 0o755); err != nil {
		return nil, err
	}
	return &Trainer{cfg: cfg, tail: &tailBuffer{max: 20}}, nil
}

func (t *Trainer) Cursor() trainer.Cursor { return t.cursor }

// Init starts the program with no checkpoint.
func (t *Trainer) Init(ctx context.Context) error {
	t.cursor = trainer.Cursor{}
	return t.start(ctx, "")
}

// Restore writes the saved files into a fresh directory, verifying each
// against the list saved with them, then starts the program on it. On error
// nothing has started and the trainer is as it was.
func (t *Trainer) Restore(ctx context.Context, from trainer.StateReader) error {
	var st state
	if err := readJSON(ctx, from, stateObject, &st); err != nil {
		return fmt.Errorf("exec trainer: %s: %w", stateObject, err)
	}
	dir, err := os.MkdirTemp(t.cfg.Scratch, "restored-")
	if err != nil {
		return err
	}
	for rel, sum := range st.Files {
		if err := restoreFile(ctx, from, st.objectOf(rel), rel, sum, dir); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("exec trainer: restoring %s: %w", rel, err)
		}
	}
	if t.cmd != nil {
		t.stop()
	}
	t.cursor, t.saved, t.savedDir = st.Cursor, st.Cursor, ""
	if len(st.Files) == 0 { // saved before any epoch: a fresh start
		os.RemoveAll(dir)
		return t.start(ctx, "")
	}
	if err := t.start(ctx, dir); err != nil {
		return err
	}
	t.savedDir = dir // what the program resumed from is the state until it reports another
	return nil
}

func restoreFile(ctx context.Context, from trainer.StateReader, object, rel, sum, dir string) error {
	if !filepath.IsLocal(filepath.FromSlash(rel)) {
		return fmt.Errorf("bad file name %q", rel)
	}
	r, err := from.Open(ctx, object)
	if err != nil {
		return err
	}
	defer r.Close()
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("content does not match the saved SHA-256 (%s, want %s)", got[:12], sum[:min(12, len(sum))])
	}
	return nil
}

// start launches the program and waits for it to connect.
func (t *Trainer) start(ctx context.Context, checkpointDir string) error {
	sock, err := t.socketPath()
	if err != nil {
		return fmt.Errorf("exec trainer: control socket: %w", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("exec trainer: control socket: %w", err)
	}
	defer ln.Close()
	cmd := exec.Command(t.cfg.Command[0], t.cfg.Command[1:]...)
	cmd.Dir = cmp.Or(t.cfg.Dir, t.cfg.Scratch)
	// A group of its own: a cancelled epoch kills the whole group. Killed
	// with the worker: a worker that dies (SIGKILL, OOM) leaves no program
	// behind holding its GPU, blocked in a collective with a dead peer.
	cmd.SysProcAttr = procAttr()
	base := t.cfg.Environ
	if base == nil {
		base = minimalEnviron()
	}
	env := append(append([]string{}, base...),
		"RANK="+strconv.Itoa(t.cfg.Rank), "WORLD_SIZE="+strconv.Itoa(t.cfg.World), "LOCAL_RANK="+strconv.Itoa(t.cfg.LocalRank),
		"LOCAL_WORLD_SIZE="+strconv.Itoa(max(1, t.cfg.LocalWorld)), "GROUP_RANK="+strconv.Itoa(t.cfg.GroupRank), "NODE_RANK="+strconv.Itoa(t.cfg.GroupRank),
		"GROUP_WORLD_SIZE="+strconv.Itoa(max(1, t.cfg.GroupWorld)), "ROLE_NAME=default", "ROLE_RANK="+strconv.Itoa(t.cfg.Rank),
		"ROLE_WORLD_SIZE="+strconv.Itoa(t.cfg.World), "TORCHELASTIC_RUN_ID="+t.cfg.RunID, "TORCHELASTIC_RESTART_COUNT="+strconv.Itoa(t.cfg.Restarts),
		"MASTER_ADDR="+t.cfg.MasterAddr, "MASTER_PORT="+strconv.Itoa(t.cfg.MasterPort),
		"DURABLETRAIN_CONTROL="+sock, "DURABLETRAIN_EPOCHS="+strconv.Itoa(t.cfg.Epochs),
		"DURABLETRAIN_START_EPOCH="+strconv.Itoa(t.cursor.Epoch), "DURABLETRAIN_START_STEP="+strconv.Itoa(t.cursor.Step), "DURABLETRAIN_CONFIG="+cmp.Or(t.cfg.Hyper, "{}"), "PYTHONUNBUFFERED=1")
	if checkpointDir != "" {
		env = append(env, "DURABLETRAIN_CHECKPOINT_DIR="+checkpointDir)
	}
	if t.cfg.Devices != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+t.cfg.Devices)
	}
	if t.cfg.PythonPath != "" {
		env = append(env, "PYTHONPATH="+t.cfg.PythonPath+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"))
	}
	for k, v := range t.cfg.Env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	// The output goes through pipes of exec's own, copied by Wait's
	// goroutines: Wait then waits for it to close for at most WaitDelay
	// after the program exits, where a process the program left behind,
	// in a session of its own, may hold it open for ever.
	stdout, stdoutW := io.Pipe()
	stderr, stderrW := io.Pipe()
	cmd.Stdout, cmd.Stderr, cmd.WaitDelay = stdoutW, stderrW, outputWaitDelay
	if err := cmd.Start(); err != nil {
		if outOfWorkerResources(err) {
			return fmt.Errorf("exec trainer: this worker cannot start exec.command %s now: %w (the worker's own limits, not a fault of the program: the run tries again)", quotedCommand(t.cfg.Command), err)
		}
		// No such program, not executable, no such directory: the spec's
		// exec section is wrong, and no retry on any worker will start it.
		return trainer.UserError(fmt.Errorf("exec trainer: cannot start exec.command %s: %w", quotedCommand(t.cfg.Command), err))
	}
	t.cmd, t.exited, t.exitErr, t.paused = cmd, make(chan struct{}), nil, false
	var streams sync.WaitGroup
	for name, r := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		streams.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), maxOutputLine)
			sc.Split(splitOutputLines)
			for sc.Scan() {
				line := sc.Text()
				if name == "stderr" {
					t.tail.add(line)
				}
				t.cfg.Log.Info(line, zap.Int("rank", t.cfg.Rank), zap.String("stream", name))
			}
		})
	}
	go func() {
		err := cmd.Wait()
		if errors.Is(err, exec.ErrWaitDelay) {
			err = nil // it exited by itself, with status 0; something it left holds its output
		}
		stdoutW.Close()
		stderrW.Close()
		streams.Wait()
		t.exitErr = err
		close(t.exited)
	}()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	timer := time.NewTimer(t.cfg.StartTimeout)
	defer timer.Stop()
	select {
	case c := <-accepted:
		t.conn, t.in = c, readMessages(c)
		return nil
	case <-t.exited:
		return t.exitError("exited before it connected to the control socket (does it import durabletrain and call epochs()?)")
	case <-timer.C:
		t.stop()
		return fmt.Errorf("exec trainer: %s did not connect within %v", t.cfg.Command[0], t.cfg.StartTimeout)
	case <-ctx.Done():
		t.stop()
		return ctx.Err()
	}
}

// outOfWorkerResources says whether err is a want of the worker's own
// resources (no descriptor left, for the worker or the system; a fork or
// an allocation refused for want of memory or processes): the worker's
// fault, which a user error would make the run's for good, whether it met
// starting the program or reading the program's files.
func outOfWorkerResources(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.EAGAIN, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// socketPath is where the control socket goes: in the scratch directory,
// or, where that path would pass the 107 bytes a Unix socket's name may
// have (a long run name, a deep scratch root), in a short directory of its
// own that only this user may enter, removed with the trainer.
func (t *Trainer) socketPath() (string, error) {
	sock := filepath.Join(t.cfg.Scratch, "control.sock")
	if len(sock) > 100 {
		if t.sockDir == "" {
			dir, err := os.MkdirTemp("", "dtctl-")
			if err != nil {
				return "", err
			}
			t.sockDir = dir // MkdirTemp makes it 0700
		}
		sock = filepath.Join(t.sockDir, "c")
	}
	os.Remove(sock)
	return sock, nil
}

// exitError describes how the program ended, with its last lines of stderr.
func (t *Trainer) exitError(what string) error {
	return &ExitError{Program: strings.Join(t.cfg.Command, " "), Rank: t.cfg.Rank, What: what, Err: t.exitErr, Stderr: t.tail.lines()}
}

// ExitError is a program that ended when it should not have: a user error.
type ExitError struct {
	Program string
	Rank    int
	What    string
	Err     error
	Stderr  []string
}

func (e *ExitError) Error() string {
	msg := fmt.Sprintf("rank %d: %s %s", e.Rank, e.Program, e.What)
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	if len(e.Stderr) > 0 {
		msg += "; last lines of stderr:\n" + strings.Join(e.Stderr, "\n")
	}
	return msg
}

// Is makes a program that failed by itself a user error
// (errors.Is(err, trainer.ErrUser)); one a signal ended is not.
func (e *ExitError) Is(target error) bool { return target == trainer.ErrUser && !e.Killed() }

// Killed says whether a signal ended the program (a killed rank, not a bug in it).
func (e *ExitError) Killed() bool {
	var ee *exec.ExitError
	if errors.As(e.Err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	return false
}

// Evaluate returns what the program reported for the epoch: it evaluates itself.
func (t *Trainer) Evaluate(ctx context.Context) (trainer.EvalMetrics, error) {
	if t.last.Metrics == nil {
		return trainer.EvalMetrics{}, errors.New("exec trainer: no epoch reported yet")
	}
	e := trainer.EvalMetrics{TestLoss: t.last.Metrics[spec.MetricTestLoss], TestAccuracy: t.last.Metrics[spec.MetricTestAccuracy],
		Examples: int(t.last.Metrics["test_examples"])}
	for name, v := range t.last.Metrics {
		if !slices.Contains(spec.Metrics, name) {
			if e.Other == nil {
				e.Other = map[string]float64{}
			}
			e.Other[name] = v
		}
	}
	for _, name := range spec.Metrics {
		if _, ok := t.last.Metrics[name]; !ok {
			e.Absent = append(e.Absent, name)
		}
	}
	return e, nil
}

// checkMetrics refuses a report whose metrics could not travel: a name
// that is not a metric's, or more than spec.MaxOtherMetrics beyond the three.
func checkMetrics(epoch int, metrics map[string]float64) error {
	other := 0
	for _, name := range slices.Sorted(maps.Keys(metrics)) {
		if err := spec.CheckMetricName(fmt.Sprintf("the program's report of epoch %d: a metric", epoch), name); err != nil {
			return trainer.UserError(err)
		}
		if !slices.Contains(spec.Metrics, name) {
			other++
		}
	}
	if other > spec.MaxOtherMetrics {
		return trainer.UserError(fmt.Errorf("the program's report of epoch %d has %d metrics beyond %s; want at most %d",
			epoch, other, strings.Join(spec.Metrics, ", "), spec.MaxOtherMetrics))
	}
	return nil
}

// Save writes the last reported checkpoint directory, file by file, and the
// list of files with their SHA-256 and the cursor.
func (t *Trainer) Save(ctx context.Context, to trainer.StateWriter) error {
	st := state{Cursor: t.saved, Files: map[string]string{}}
	if t.savedDir != "" && t.saved != t.cursor {
		return trainer.UserError(fmt.Errorf("exec trainer: a checkpoint is due at epoch %d step %d, but the program's latest checkpoint_dir is of epoch %d step %d: "+
			"report a checkpoint_dir with every epoch's report, and pass save= to durabletrain.steps()", t.cursor.Epoch, t.cursor.Step, t.saved.Epoch, t.saved.Step))
	}
	if t.savedDir == "" {
		if !t.cfg.Saves {
			return fmt.Errorf("exec trainer: rank %d was not configured to save (Config.Saves)", t.cfg.Rank)
		}
		if t.cursor != (trainer.Cursor{}) {
			return errors.New("exec trainer: the program has reported no checkpoint_dir to save: call durabletrain.report(metrics, checkpoint_dir=...)")
		}
		return writeState(ctx, to, state{Files: map[string]string{}}) // nothing trained yet
	}
	err := filepath.WalkDir(t.savedDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(t.savedDir, path)
		rel = filepath.ToSlash(rel)
		object := "files/" + rel
		// Checked with the longest prefix a rank's part of a sharded checkpoint adds.
		if !checkpoint.ValidObjectName(checkpoint.ShardPrefix(checkpoint.MaxShardRank) + object) {
			object = fmt.Sprintf("%s%06d", renamedPrefix, len(st.Objects))
			if st.Objects == nil {
				st.Objects = map[string]string{}
			}
			st.Objects[rel] = object
		}
		sum, err := saveFile(ctx, to, path, object)
		st.Files[rel] = sum
		return err
	})
	if err != nil {
		return err
	}
	return writeState(ctx, to, st)
}

func writeState(ctx context.Context, to trainer.StateWriter, st state) error {
	w, err := to.Create(ctx, stateObject)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(st) // map keys sorted: deterministic
	if _, err := w.Write(b); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// Close asks the program to end, and kills its process group if it does not.
func (t *Trainer) Close() error {
	if t.cmd != nil {
		t.stop()
	}
	if t.sockDir != "" {
		os.RemoveAll(t.sockDir)
		t.sockDir = ""
	}
	return nil
}

func (t *Trainer) stop() {
	if t.conn != nil {
		t.send(message{Op: "exit"})
		t.conn.Close()
		t.conn = nil
	}
	if t.in != nil {
		t.in.close()
	}
	select {
	case <-t.exited:
	case <-time.After(5 * time.Second):
		syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.exited
	}
	t.cmd = nil
}

func readJSON(ctx context.Context, from trainer.StateReader, name string, v any) error {
	r, err := from.Open(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func saveFile(ctx context.Context, to trainer.StateWriter, path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	w, err := to.Create(ctx, name)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(w, h), f); err != nil {
		w.Close()
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), w.Close()
}

// copyFile copies the regular file src, or the one a symbolic link src
// names, to dst. Anything else is refused without blocking: a named pipe
// would wait forever for a writer, a device such as /dev/zero never ends,
// and the worker copies while it should be answering its gang. It opens
// src without waiting and asks the open file what it is, so a file swapped
// for a pipe after a look is refused all the same.
func copyFile(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s, not a regular file; want a checkpoint directory of regular files, links to them and directories (not links to directories)", src, fileKind(info.Mode()))
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return &copyError{err}
	}
	out, err := os.Create(dst)
	if err != nil {
		return &copyError{err}
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		if pe := (*os.PathError)(nil); errors.As(err, &pe) && pe.Path == dst {
			return &copyError{err} // the worker's write (a full or failing disk), not the program's file
		}
		return err
	}
	if err := out.Close(); err != nil {
		return &copyError{err}
	}
	return nil
}

// copyError is a failure to write the worker's copy of a checkpoint file
// (its scratch disk full or failing): the worker's fault, which another
// gang may not meet, not the program's.
type copyError struct{ err error }

func (e *copyError) Error() string { return e.err.Error() }
func (e *copyError) Unwrap() error { return e.err }

// splitOutputLines splits a program's output into lines as a terminal
// shows them: at '\n', at '\r' (a progress bar redrawing its line; "\r\n"
// is one end), and every maxOutputLine bytes of a line that goes on, which
// is logged in pieces. A reader that stopped at a long line instead would
// leave the program blocked on its next write, its gang waiting on it.
func splitOutputLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		switch {
		case data[i] == '\n':
			return i + 1, data[:i], nil
		case i+1 < len(data):
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		case atEOF || len(data) >= maxOutputLine:
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a '\r' last: is a '\n' next?
	}
	if len(data) >= maxOutputLine {
		return maxOutputLine, data[:maxOutputLine], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// maxOutputLine is the longest line of a program's output logged whole.
const maxOutputLine = 64 << 10

// fileKind names what a file that is not a regular one is.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "special file (" + m.String() + ")"
}

// tailBuffer keeps the last lines of a stream.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []string
}

func (b *tailBuffer) add(s string) {
	b.mu.Lock()
	b.buf = append(b.buf, s)
	if len(b.buf) > b.max {
		b.buf = b.buf[len(b.buf)-b.max:]
	}
	b.mu.Unlock()
}

func (b *tailBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.buf...)
}

// minimalEnviron is what a program gets of the worker's environment when
// the caller says nothing: enough to find programs and a home.
func minimalEnviron() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "LANG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// quotedCommand shows a command in an error, bounded.
func quotedCommand(c []string) string {
	s := fmt.Sprintf("%q", c)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// outputWaitDelay is how long, after a program exits, its output may stay
// open (held by a process it left behind) before the worker stops reading it.
const outputWaitDelay = 5 * time.Second
