package exectrainer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Spare processes. A rank of the Python front door (python -m
// durabletrain._rank) spends most of its start importing PyTorch: about 2 s
// of a 4.6 s restart on a 2-core VM, where the gang re-forms in 0.15 s. With
// Config.Spare (exec.warm_spare), every such rank keeps a spare on its
// worker: `python -m durabletrain._spare`, started spareDelay after the
// rank's program has connected, with the environment an interpreter reads as it starts
// (startEnviron), which imports PyTorch and waits. The rank's next start on
// this worker with the same command and start environment (the new gang
// after a failure: a rank killed, hung, or a peer lost) takes the spare and
// writes it its whole environment and working directory on standard input;
// the spare sets them and runs durabletrain._rank as `-m` would. A spare
// nobody takes is stopped spareIdle after the last rank that kept it
// closed. The cost: one idle interpreter with PyTorch loaded (about 300 MB)
// per rank.

// spareDelay is how long after a rank's program connected its spare starts.
var spareDelay = 15 * time.Second

// spareIdle is how long spares outlive the last rank that kept them: long
// enough for a failed gang's ranks to be started again on this worker.
var spareIdle = 2 * time.Minute

// spareModule is the spare's module, in the durabletrain package.
const spareModule = "durabletrain._spare"

// spareKey says whether this rank may use a spare, and under which key:
// its command is the front door's, and Spare is set.
func (t *Trainer) spareKey() (string, bool) {
	c := t.cfg.Command
	if !t.cfg.Spare || len(c) != 3 || c[1] != "-m" || c[2] != "durabletrain._rank" {
		return "", false
	}
	// Not the rank's own: its scratch directory (the working directory
	// where exec.dir is unset), which the go-ahead sets.
	h := sha256.New()
	for _, part := range [][]string{c, {t.cfg.Dir}, t.baseEnviron(), t.startEnviron()} {
		h.Write([]byte(strings.Join(part, "\x00")))
		h.Write([]byte{1})
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// spareCommand is the spare's command: the rank's interpreter.
func (t *Trainer) spareCommand() []string {
	return []string{t.cfg.Command[0], "-m", spareModule}
}

// sparePool is a worker's spares, by key, and how many ranks keep each key.
type sparePool struct {
	mu   sync.Mutex
	idle map[string][]*process
	kept map[string]int
}

var spares sparePool

// hold notes a rank that keeps spares of key and, spareDelay later, starts
// a spare for it, so that there is a spare for every rank that keeps the key.
// Not at once: a gang that has just started (or started again) needs every
// core, and a spare's start is an interpreter and PyTorch's import.
func (s *sparePool) hold(key string, command []string, dir string, env []string) {
	s.mu.Lock()
	if s.kept == nil {
		s.kept, s.idle = map[string]int{}, map[string][]*process{}
	}
	s.kept[key]++
	s.mu.Unlock()
	time.AfterFunc(spareDelay, func() { s.fill(key, command, dir, env) })
}

// fill starts spares of key until every rank that keeps it has one.
func (s *sparePool) fill(key string, command []string, dir string, env []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.idle[key]) < s.kept[key] {
		p, err := startSpare(command, dir, env)
		if err != nil {
			return // no spare: the rank's next start starts its program as ever
		}
		s.idle[key] = append(s.idle[key], p)
	}
}

// release notes that a rank keeping key closed; spareIdle later, spares no
// rank keeps any more are stopped.
func (s *sparePool) release(key string) {
	s.mu.Lock()
	s.kept[key]--
	s.mu.Unlock()
	time.AfterFunc(spareIdle, func() { s.prune(key) })
}

// prune stops the spares of key beyond the ranks that keep it.
func (s *sparePool) prune(key string) {
	s.mu.Lock()
	var extra []*process
	if n := s.kept[key]; len(s.idle[key]) > n {
		extra = s.idle[key][n:]
		s.idle[key] = s.idle[key][:n]
	}
	if s.kept[key] <= 0 && len(s.idle[key]) == 0 {
		delete(s.kept, key)
		delete(s.idle, key)
	}
	s.mu.Unlock()
	for _, p := range extra {
		p.kill()
	}
}

// take is a running spare of key, or nil.
func (s *sparePool) take(key string) *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.idle[key]) > 0 {
		p := s.idle[key][0]
		s.idle[key] = s.idle[key][1:]
		select {
		case <-p.exited: // it died idle (killed, out of memory): next
		default:
			return p
		}
	}
	return nil
}

// startSpare starts a spare process in dir with env.
func startSpare(command []string, dir string, env []string) (*process, error) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Dir = dir
	cmd.SysProcAttr = procAttr()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdin = r
	p, err := launch(cmd, append(env, "PYTHONUNBUFFERED=1"))
	r.Close() // the spare's now
	if err != nil {
		w.Close()
		return nil, err
	}
	p.stdin = w
	return p, nil
}

// goAhead makes the spare this rank: it writes the rank's whole
// environment and working directory, which the spare sets before it runs
// durabletrain._rank.
func (p *process) goAhead(env []string, dir string) error {
	b, _ := json.Marshal(map[string]any{"env": env, "dir": dir})
	done := make(chan error, 1)
	go func() {
		_, err := p.stdin.Write(append(b, '\n'))
		if err == nil {
			err = p.stdin.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-p.exited:
		return io.ErrClosedPipe
	case <-time.After(10 * time.Second): // it never read: hung, not spare
		return io.ErrNoProgress
	}
}
