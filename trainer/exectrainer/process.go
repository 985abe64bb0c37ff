package exectrainer

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
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

	"github.com/durabletrain/durabletrain/trainer"
	"go.uber.org/zap"
)

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
	env := append(t.baseEnviron(),
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
	// A directory of the rank's own for the program's files: exec.dir, when
	// the spec sets it, is shared by every rank and every trial that runs
	// there, and a checkpoint written to the same relative path by two
	// programs at once would be the one or the other's.
	own, err := t.ownDir()
	if err != nil {
		return fmt.Errorf("exec trainer: the program's own directory: %w", err)
	}
	env = append(env, "DURABLETRAIN_SCRATCH_DIR="+own)
	if t.cfg.StallTimeout > 0 {
		// Five keepalives within the stall timeout, as the collective's ring sends.
		env = append(env, "DURABLETRAIN_KEEPALIVE="+strconv.FormatFloat((t.cfg.StallTimeout/5).Seconds(), 'f', -1, 64))
	}
	env = append(env, t.startEnviron()...)
	key, spareOK := t.spareKey()
	var proc *process
	if spareOK {
		proc = spares.take(key)
	}
	if proc != nil {
		// A spare started ahead (spare.go): its interpreter is up and PyTorch
		// imported; it becomes this rank on the environment written to it.
		if err := proc.goAhead(env, cmd.Dir); err != nil {
			proc.kill()
			proc = nil
		}
	}
	if proc == nil {
		proc, err = launch(cmd, env)
		if err != nil {
			if outOfWorkerResources(err) {
				return fmt.Errorf("exec trainer: this worker cannot start exec.command %s now: %w (the worker's own limits, not a fault of the program: the run tries again)", quotedCommand(t.cfg.Command), err)
			}
			// No such program, not executable, no such directory: the spec's
			// exec section is wrong, and no retry on any worker will start it.
			return trainer.UserError(fmt.Errorf("exec trainer: cannot start exec.command %s: %w", quotedCommand(t.cfg.Command), err))
		}
	}
	proc.output(func(name, line string) {
		if name == "stderr" {
			t.tail.add(line)
		}
		t.cfg.Log.Info(line, zap.Int("rank", t.cfg.Rank), zap.String("stream", name))
	})
	t.proc, t.cmd, t.exited, t.paused = proc, proc.cmd, proc.exited, false
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
		t.conn, t.in = c, readMessages(c, t.cfg.StallTimeout)
		if spareOK && t.spareHeld == "" {
			t.spareHeld = key
			spares.hold(key, t.spareCommand(), cmd.Dir, append(t.baseEnviron(), t.startEnviron()...))
		}
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

// baseEnviron is the worker's environment the program gets.
func (t *Trainer) baseEnviron() []string {
	if t.cfg.Environ == nil {
		return minimalEnviron()
	}
	return append([]string{}, t.cfg.Environ...)
}

// startEnviron is the program's environment that its interpreter reads
// as it starts, or its libraries as they load (the device, PYTHONPATH,
// exec.env's OMP_NUM_THREADS and the like), after torchrun's variables:
// what a spare process must be started with (spare.go).
func (t *Trainer) startEnviron() []string {
	var env []string
	if t.cfg.Devices != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+t.cfg.Devices)
	}
	if t.cfg.PythonPath != "" {
		env = append(env, "PYTHONPATH="+t.cfg.PythonPath+string(os.PathListSeparator)+os.Getenv("PYTHONPATH"))
	}
	keys := make([]string, 0, len(t.cfg.Env))
	for k := range t.cfg.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys) // one order, so that equal environments make equal spare keys
	for _, k := range keys {
		env = append(env, k+"="+t.cfg.Env[k])
	}
	return env
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

// ownDir is the program's own directory (DURABLETRAIN_SCRATCH_DIR), in the
// rank's scratch directory: no other rank or run writes there, and files
// the program leaves in it are kept for its next start on this worker.
func (t *Trainer) ownDir() (string, error) {
	dir, err := filepath.Abs(filepath.Join(t.cfg.Scratch, "program"))
	if err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// exitError describes how the program ended, with its last lines of stderr.
func (t *Trainer) exitError(what string) error {
	return &ExitError{Program: strings.Join(t.cfg.Command, " "), Rank: t.cfg.Rank, What: what, Err: t.proc.exitErr, Stderr: t.tail.lines(), MasterPort: t.cfg.MasterPort}
}

// ExitError is a program that ended when it should not have: a user error.
type ExitError struct {
	Program string
	Rank    int
	What    string
	Err     error
	Stderr  []string
	// MasterPort is the rendezvous port the program was given: one that
	// another process bound between its choice and the program's bind is
	// the host's race, not the program's bug (PortTaken).
	MasterPort int
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
// (errors.Is(err, trainer.ErrUser)); one a signal ended is not, nor one
// that could not bind its rendezvous port (PortTaken): a new gang, with
// another port, will do.
func (e *ExitError) Is(target error) bool {
	return target == trainer.ErrUser && !e.Killed() && !e.PortTaken()
}

// PortTaken says whether the program's last words are that its rendezvous
// port (MASTER_PORT) was in use: torch.distributed's TCPStore, gloo or
// NCCL failing to bind ":<port>" with EADDRINUSE. The worker chose the
// port free, but only a bind holds it, and on a busy host another process
// may take it first.
func (e *ExitError) PortTaken() bool {
	if e.MasterPort == 0 {
		return false
	}
	port := ":" + strconv.Itoa(e.MasterPort)
	for _, line := range e.Stderr {
		if strings.Contains(line, port) && (strings.Contains(line, "Address already in use") || strings.Contains(line, "EADDRINUSE") || strings.Contains(line, "errno: 98")) {
			return true
		}
	}
	return false
}

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

// process is a started program: its command, its output, and its end.
type process struct {
	cmd   *exec.Cmd
	stdin *os.File // a spare's, where its go-ahead is written; nil for others
	// exited closes once the program has exited and its output is read to
	// the end (or outputWaitDelay passed); exitErr is then how it ended.
	exited  chan struct{}
	exitErr error
	mu      sync.Mutex
	sink    func(stream, line string) // where its lines go; nil: dropped
}

// launch starts cmd with env. Its output goes through pipes of exec's own,
// copied by Wait's goroutines: Wait then waits for it to close for at most
// WaitDelay after the program exits, where a process the program left
// behind, in a session of its own, may hold it open for ever.
func launch(cmd *exec.Cmd, env []string) (*process, error) {
	cmd.Env = env
	stdout, stdoutW := io.Pipe()
	stderr, stderrW := io.Pipe()
	cmd.Stdout, cmd.Stderr, cmd.WaitDelay = stdoutW, stderrW, outputWaitDelay
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	var streams sync.WaitGroup
	for name, r := range map[string]io.Reader{"stdout": stdout, "stderr": stderr} {
		streams.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), maxOutputLine)
			sc.Split(splitOutputLines)
			for sc.Scan() {
				p.mu.Lock()
				sink := p.sink
				p.mu.Unlock()
				if sink != nil {
					sink(name, sc.Text())
				}
			}
			io.Copy(io.Discard, r) // past a read error: the program must not block on its output
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
		p.exitErr = err
		close(p.exited)
	}()
	return p, nil
}

// output sends the program's lines, from now on, to sink.
func (p *process) output(sink func(stream, line string)) {
	p.mu.Lock()
	p.sink = sink
	p.mu.Unlock()
}

// kill ends the program's whole process group and waits for its end.
func (p *process) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
	if p.stdin != nil {
		p.stdin.Close()
	}
}
