package exectrainer

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/trainer"
)

// The control protocol, one JSON object per line over the rank's Unix
// socket (python/durabletrain is the program's side):
//
//	program → worker                          worker → program
//	ready                                     epoch {epoch, start_step, sync} | exit
//	metrics {epoch, step, metrics}            (none: metrics at a step)
//	sync {epoch, step, steps}                 go {sync} | save
//	saved {epoch, step, checkpoint_dir}       go {sync} | exit
//	report {…, checkpoint_dir} in steps()     go {sync} | exit
//	report {…, end: true}                     ack
//	  (no_checkpoint: true: no checkpoint_dir on purpose; Save says ErrNoCheckpoint)
//	finished {epoch} (in place of a report:   exit
//	  its training ended before the run's epochs)
//	alive (a keepalive, from a thread of its  (none)
//	  own, every DURABLETRAIN_KEEPALIVE seconds)
//
// sync is the step (steps done in the epoch) at which the program next
// stops to ask whether to go on; 0: not again this epoch. The gang's
// workers agree on it, so every rank's program stops at the same steps.
type message struct {
	Op            string             `json:"op"`
	Epoch         int                `json:"epoch"`
	Step          int                `json:"step,omitempty"`
	Steps         int                `json:"steps,omitempty"`
	StartStep     int                `json:"start_step,omitempty"`
	Sync          int                `json:"sync,omitempty"`
	Metrics       map[string]float64 `json:"metrics,omitempty"`
	CheckpointDir string             `json:"checkpoint_dir,omitempty"`
	End           bool               `json:"end,omitempty"`
	// NoCheckpoint: an end report with no checkpoint_dir on purpose (a
	// Ray-style report of metrics alone): the epoch has no checkpoint.
	NoCheckpoint bool `json:"no_checkpoint,omitempty"`
}

// maxLine bounds one message from the program.
const maxLine = 1 << 20

// inbox is the program's messages, read as they come. Keepalives are
// taken out: they only say the program's process still runs.
type inbox struct {
	lines chan []byte
	done  chan struct{}
	err   error // why reading stopped; set before lines closes

	// stalled closes when the program has sent nothing, not even a
	// keepalive, for the stall timeout, once it has sent its first
	// keepalive (a program that never sends one, one that speaks the
	// protocol without the helper, is not watched); silence is then how
	// long it had been silent.
	stalled chan struct{}
	silence time.Duration
	heard   atomic.Int64 // when the last line came, in UnixNano
	armed   atomic.Bool  // a keepalive has come
}

// keepaliveLine is the helper's keepalive, byte for byte.
var keepaliveLine = []byte(`{"op": "alive"}`)

// readMessages reads the program's lines; stall > 0 watches its keepalives.
func readMessages(c net.Conn, stall time.Duration) *inbox {
	in := &inbox{lines: make(chan []byte), done: make(chan struct{}), stalled: make(chan struct{})}
	in.heard.Store(time.Now().UnixNano())
	go func() {
		defer close(in.lines)
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 64<<10), maxLine)
		for sc.Scan() {
			in.heard.Store(time.Now().UnixNano())
			if bytes.Equal(bytes.TrimSpace(sc.Bytes()), keepaliveLine) {
				in.armed.Store(true)
				continue
			}
			select {
			case in.lines <- bytes.Clone(sc.Bytes()):
			case <-in.done:
				return
			}
		}
		in.err = sc.Err()
	}()
	if stall > 0 {
		go in.watch(stall)
	}
	return in
}

// watch closes stalled once the program has been silent for stall. Like the
// collective's ring, it counts silence only while the worker itself runs: a
// tick that comes late (the worker off its cores: a host starved of CPU, a
// VM paused) starts the count again from that tick, since the program's
// keepalives may be waiting, unread, in the socket.
func (in *inbox) watch(stall time.Duration) {
	every := max(stall/10, time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := time.Now()
	var ranLate time.Time
	for {
		select {
		case <-in.done:
			return
		case now := <-tick.C:
			now = time.Now()
			if now.Sub(last) > 2*every+50*time.Millisecond {
				ranLate = now
			}
			last = now
			if !in.armed.Load() {
				continue
			}
			heard := time.Unix(0, in.heard.Load())
			from := heard
			if ranLate.After(from) {
				from = ranLate
			}
			if now.Sub(from) >= stall {
				in.silence = now.Sub(heard)
				close(in.stalled)
				return
			}
		}
	}
}

func (in *inbox) close() {
	select {
	case <-in.done:
	default:
		close(in.done)
	}
}

func (t *Trainer) send(msg message) error {
	b, _ := json.Marshal(msg)
	if _, err := t.conn.Write(append(b, '\n')); err != nil {
		return t.ended(context.Background(), "closed its control socket")
	}
	return nil
}

// ended describes how a program whose control socket closed ended. The
// socket closes as the program ends, before the kernel hands over its exit
// status, and the status says whether a signal ended it (a killed rank) or it
// ended by itself (a user error): so it waits for the status, for at most
// exitStatusWait, then kills the program as broken.
func (t *Trainer) ended(ctx context.Context, what string) error {
	select {
	case <-t.exited:
		return t.exitError(what)
	case <-ctx.Done():
		t.kill()
		return ctx.Err()
	case <-time.After(exitStatusWait):
		e := &ExitError{Program: strings.Join(t.cfg.Command, " "), Rank: t.cfg.Rank, What: fmt.Sprintf("closed its control socket but did not exit within %v", exitStatusWait), Stderr: t.tail.lines()}
		t.kill()
		return e
	}
}

// exitStatusWait is how long a program whose control socket closed has to
// exit before it is killed as broken: 5 s, and the outputWaitDelay its exit
// status may wait for its output to close.
const exitStatusWait = 5*time.Second + outputWaitDelay

// next is the program's next message; a cancelled context kills its
// process group. doing says what the program should be doing, for the
// error if it ends instead.
func (t *Trainer) next(ctx context.Context, doing string) (message, error) {
	select {
	case b, ok := <-t.in.lines:
		if !ok {
			if errors.Is(t.in.err, bufio.ErrTooLong) {
				t.kill()
				return message{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent a message longer than %d bytes", t.cfg.Rank, maxLine))
			}
			return message{}, t.ended(ctx, "ended while it should "+doing)
		}
		var m message
		if err := json.Unmarshal(b, &m); err != nil || m.Op == "" {
			t.kill()
			return message{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent %q, not a message of durabletrain's protocol", t.cfg.Rank, clip(string(b))))
		}
		return m, nil
	case <-t.in.stalled:
		silence := t.in.silence
		t.kill()
		return message{}, &StalledError{Rank: t.cfg.Rank, Silence: silence, Timeout: t.cfg.StallTimeout, Doing: doing}
	case <-ctx.Done():
		t.kill()
		return message{}, ctx.Err()
	}
}

// StalledError is a program that stopped sending its keepalives while it
// should have been training (a process stopped by SIGSTOP, hung in the
// kernel, or off its cores far longer than the stall timeout): the worker
// killed it, and the gang re-forms. It is the rank's fault, not the
// program's bug: a new gang may go on.
type StalledError struct {
	Rank    int
	Silence time.Duration // how long it had sent nothing
	Timeout time.Duration // the stall timeout (failure.stall_timeout)
	Doing   string        // what it should have been doing
}

func (e *StalledError) Error() string {
	return fmt.Sprintf("exec trainer: rank %d's program sent nothing, not even its keepalive, for %v (the stall timeout, failure.stall_timeout, is %v) while it should %s: "+
		"it is hung or stopped (SIGSTOP), and was killed", e.Rank, e.Silence.Round(time.Millisecond), e.Timeout, e.Doing)
}

// expect is the program's next message, which must be op.
func (t *Trainer) expect(ctx context.Context, op, doing string) (message, error) {
	m, err := t.next(ctx, doing)
	if err == nil && m.Op != op {
		t.kill()
		return m, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent %q where %q was due (it should %s)", t.cfg.Rank, m.Op, op, doing))
	}
	return m, err
}

// kill ends the program's whole process group at once.
func (t *Trainer) kill() {
	if t.cmd == nil {
		return
	}
	syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
	<-t.exited
	t.in.close()
	t.conn.Close()
	t.conn, t.cmd, t.paused = nil, nil, false
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// The events the gang's workers vote on: every rank's program must reach
// the same events at the same steps.
const (
	atSync       = 1 // steps() stopped at the agreed step
	atCheckpoint = 2 // report(checkpoint_dir=…) inside steps()
	atEpochEnd   = 3 // the epoch's report
)

var eventNames = map[int]string{atSync: "agreed stop", atCheckpoint: "checkpoint report", atEpochEnd: "epoch's report"}

// vote is the gang's agreement at an event: one all-reduce of four
// numbers among the ranks' workers. It says whether any rank's worker is
// leaving, checks that this rank's program is at rank 0's event and step,
// and carries rank 0's choice of the next step to stop at (proposal).
func (t *Trainer) vote(ctx context.Context, event, step, proposal int, leave <-chan struct{}) (leaving bool, next int, err error) {
	buf := []float32{0, 0, 0, 0}
	select {
	case <-leave:
		buf[0] = 1
	default:
	}
	if t.cfg.Comm.Rank() == 0 {
		buf[1], buf[2], buf[3] = float32(event), float32(step), float32(proposal)
	}
	timeout := max(t.cfg.VoteTimeout, 20*t.epoch.slowest)
	vctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := t.cfg.Comm.AllReduce(vctx, buf); err != nil {
		if ctx.Err() == nil && vctx.Err() != nil {
			t.kill()
			return false, 0, fmt.Errorf("exec trainer: rank %d's program is at its %s at epoch %d step %d, and the gang's other ranks did not get there within %v: "+
				"every rank must report a checkpoint at the same steps and leave durabletrain.steps() together", t.cfg.Rank, eventNames[event], t.cursor.Epoch, step, timeout)
		}
		return false, 0, fmt.Errorf("exec trainer: the gang broke at epoch %d step %d: %w", t.cursor.Epoch, step, err)
	}
	if int(buf[1]) != event || int(buf[2]) != step {
		t.kill()
		return false, 0, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program is at its %s at epoch %d step %d, but rank 0's is at its %s at step %d: "+
			"every rank must report a checkpoint at the same steps and leave durabletrain.steps() together",
			t.cfg.Rank, eventNames[event], t.cursor.Epoch, step, eventNames[int(buf[1])], int(buf[2])))
	}
	return buf[0] > 0, int(buf[3]), nil
}

// epochPace is what the worker knows of the epoch under way.
type epochPace struct {
	steps    int     // the epoch's steps, once the program says
	loss     float64 // the newest train_loss the program reported
	lossAt   int     // the step it reported it at (0: none yet)
	lastAt   time.Time
	lastStep int
	perStep  time.Duration // the newest time per step
	slowest  time.Duration // the longest stretch between two agreements
	reported int           // the newest step Progress was given
}

// observe notes that the program reached step at now.
func (p *epochPace) observe(step int, now time.Time) {
	if !p.lastAt.IsZero() && step > p.lastStep {
		d := now.Sub(p.lastAt)
		p.perStep = d / time.Duration(step-p.lastStep)
		p.slowest = max(p.slowest, d)
	}
	p.lastAt, p.lastStep = now, step
}

// stopTally is what one TrainEpoch call's stops at agreed steps cost the
// program: it waits from its "sync" until the worker's "go", the gang's
// vote included. The worker logs it when the call ends, so a slow epoch
// shows whether the program trained slowly or waited on its gang.
type stopTally struct {
	stops     int
	stopped   time.Duration // from each sync's arrival to its go
	slowest   time.Duration // the longest of them
	firstStep int           // the step of the call's first stop
	firstAt   time.Duration // when it arrived, since the call began
}

func (s *stopTally) add(step int, at, stopped time.Duration) {
	if s.stops == 0 {
		s.firstStep, s.firstAt = step, at
	}
	s.stops++
	s.stopped += stopped
	s.slowest = max(s.slowest, stopped)
}

func (s *stopTally) log(log *zap.Logger, rank, epoch int, start time.Time) {
	if log == nil || s.stops == 0 {
		return
	}
	log.Info("exec trainer: the program's stops at agreed steps", zap.Int("rank", rank), zap.Int("epoch", epoch),
		zap.Int("stops", s.stops), zap.Duration("stopped", s.stopped), zap.Duration("slowest_stop", s.slowest),
		zap.Int("first_stop_step", s.firstStep), zap.Duration("first_stop_after", s.firstAt),
		zap.Duration("call", time.Since(start)))
}

// proposal is the next step to stop at after step: about SyncEvery of
// training on, never past until (a step the caller must stop at), and 0
// when the epoch ends first.
func (t *Trainer) proposal(step, until int) int {
	n := 1
	if t.epoch.perStep > 0 {
		n = int(min(int64(t.cfg.SyncEvery/t.epoch.perStep), 1<<20))
	}
	next := step + max(1, n)
	if until > step {
		next = min(next, until)
	}
	if t.epoch.steps > 0 && next >= t.epoch.steps {
		return 0 // the epoch's report comes first
	}
	return next
}

// keep copies a checkpoint directory the program reported at cursor c, so
// the program may reuse its own. Ranks that do not save copy nothing.
func (t *Trainer) keep(dir string, c trainer.Cursor) error {
	t.saved = c
	if !t.cfg.Saves {
		return nil
	}
	if dir == "" {
		return fmt.Errorf("exec trainer: rank %d's program reported no checkpoint_dir at epoch %d step %d", t.cfg.Rank, c.Epoch, c.Step)
	}
	// A relative directory is the program's: it names it from its own
	// working directory, not the worker's.
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(cmp.Or(t.cfg.Dir, t.cfg.Scratch), dir)
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs // cleaned, and absolute as the scratch directory it is compared with
	}
	if scratch, err := filepath.Abs(t.cfg.Scratch); err == nil && within(scratch, dir) {
		return trainer.UserError(fmt.Errorf("exec trainer: rank %d's program reported checkpoint_dir %s at epoch %d step %d, which holds the rank's scratch directory %s (its control socket, the checkpoints restored and saved); want a directory of the checkpoint's own, such as a subdirectory",
			t.cfg.Rank, dir, c.Epoch, c.Step, scratch))
	}
	dst := filepath.Join(t.cfg.Scratch, fmt.Sprintf("saved-%06d-%09d", c.Epoch, c.Step))
	os.RemoveAll(dst)
	files, names := 0, 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if files, names = files+1, names+len(rel); files > MaxCheckpointFiles || names > MaxCheckpointNameBytes {
			return fmt.Errorf("more than %d files, or more than %d bytes of their names; want at most that (each file is an object of the checkpoint, listed in its manifest, which a restore reads whole)",
				MaxCheckpointFiles, MaxCheckpointNameBytes)
		}
		return copyFile(path, filepath.Join(dst, rel))
	})
	if err != nil {
		os.RemoveAll(dst)
		var ce *copyError
		if errors.As(err, &ce) || outOfWorkerResources(err) {
			return fmt.Errorf("exec trainer: keeping a copy of the checkpoint directory %s on this worker, in %s: %w", dir, t.cfg.Scratch, err)
		}
		return trainer.UserError(fmt.Errorf("exec trainer: taking the checkpoint directory %s: %w", dir, err))
	}
	if t.savedDir != "" && t.savedDir != dst {
		os.RemoveAll(t.savedDir)
	}
	t.savedDir = dst
	return nil
}

// The most files, and bytes of their names, a program's checkpoint_dir may
// hold: every file is an object of the checkpoint, and the manifest that
// lists them must stay within what a restore reads
// (checkpoint.MaxManifestBytes, 16 MiB: an object takes about 200 bytes
// of it beside its name).
const (
	MaxCheckpointFiles     = 10_000
	MaxCheckpointNameBytes = 4 << 20
)

// within says whether path is dir or lies below it (both clean and absolute).
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
