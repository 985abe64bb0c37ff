package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is one supervised process: restarted a moment after it exits, as a
// container runtime or systemd would, until the supervisor stops.
type proc struct {
	name    string
	netns   string // "" for the root namespace
	bin     string
	args    []string
	logPath string
	delay   time.Duration // before a restart

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts int
	stopping bool
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	var cmd *exec.Cmd
	if p.netns != "" {
		// ip netns exec execs the program: the PID we hold is the worker's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", p.netns, p.bin}, p.args...)...)
	} else {
		cmd = exec.Command(p.bin, p.args...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "GOMAXPROCS=2")
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		cmd.Wait()
		log.Close()
		close(exited)
		p.mu.Lock()
		stopping := p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
		time.Sleep(p.delay)
		p.mu.Lock()
		stopping = p.stopping
		p.restarts++
		p.mu.Unlock()
		if !stopping {
			p.start()
		}
	}()
	return nil
}

// signal sends sig to the current process; it returns a channel closed when
// that process exits.
func (p *proc) signal(sig syscall.Signal) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return nil, fmt.Errorf("%s is not running", p.name)
	}
	return p.exited, p.cmd.Process.Signal(sig)
}

// alive says whether the process is running now (not exited and waiting
// for its restart).
func (p *proc) alive() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// hold stops restarts (for a process killed on purpose that must stay down a while).
func (p *proc) setStopping(v bool) {
	p.mu.Lock()
	p.stopping = v
	p.mu.Unlock()
}

// stop ends the process for good.
func (p *proc) stop() {
	p.setStopping(true)
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}
