package collective

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a rank process: with DT_COLLECTIVE_RANK set it
// listens, prints its address, reads the gang from stdin, and all-reduces until killed.
func TestMain(m *testing.M) {
	if os.Getenv("DT_COLLECTIVE_RANK") != "" {
		os.Exit(rankProcess())
	}
	os.Exit(m.Run())
}

type childGang struct {
	Gang   Gang
	Rank   int
	Stall  time.Duration
	Floats int // the all-reduced buffer's length
	// Transport, and the cores the ranks count on their host
	// (Options.hostCores: with 1, TCP is read outside the poller).
	Transport string
	HostCores int
	// Pause between operations: longer than leftIdleGap, readLeft reads
	// the left link between them (without, the operations do).
	Pause time.Duration
}

func (cg childGang) options() Options {
	return Options{Secret: testSecret, StallTimeout: cg.Stall, Transport: cg.Transport, hostCores: cg.HostCores}
}

func rankProcess() int {
	ln, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println(ln.Addr())
	var cg childGang
	if err := json.NewDecoder(os.Stdin).Decode(&cg); err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := Join(ctx, ln, cg.Gang, cg.Rank, cg.options())
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	buf := make([]float32, cg.Floats)
	for op := 0; ; op++ {
		if err := g.AllReduce(ctx, buf); err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("op", op)
		time.Sleep(cg.Pause)
	}
}

// TestRealPeerFailures runs a 4-rank ring with rank 2 in its own process and
// hits that process with a real signal mid-training: every other rank must
// return a PeerError naming rank 2, well before any operation deadline. Over
// each kind of link (shared memory where automatic, TCP through the runtime's
// poller, TCP read outside it), both ways an operation moves are struck: a
// 1 MiB one (over TCP, read by readLeft while the operation's goroutine
// sends) and a 4 KiB one (over TCP, read and forwarded by the operation's
// goroutine); and over TCP, ranks that pause between 4 KiB operations, so
// that readLeft reads the link when the strike comes.
func TestRealPeerFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a rank process")
	}
	type strike struct {
		name   string
		signal syscall.Signal
		floats int
		link   childGang // its Transport and HostCores
	}
	var strikes []strike
	for _, link := range []struct {
		name string
		cg   childGang
	}{
		{"automatic", childGang{}},
		{"TCP through the poller", childGang{Transport: TransportTCP, HostCores: 64}},
		{"TCP outside the poller", childGang{Transport: TransportTCP, HostCores: 1}},
	} {
		for _, s := range []strike{
			{"kill -9, 1 MiB", syscall.SIGKILL, 1 << 18, link.cg}, {"SIGSTOP (a hang), 1 MiB", syscall.SIGSTOP, 1 << 18, link.cg},
			{"kill -9, 4 KiB", syscall.SIGKILL, 1 << 10, link.cg}, {"SIGSTOP (a hang), 4 KiB", syscall.SIGSTOP, 1 << 10, link.cg},
		} {
			s.name = link.name + "/" + s.name
			strikes = append(strikes, s)
		}
		if link.cg.Transport == TransportTCP {
			paused := link.cg
			paused.Pause = 3 * leftIdleGap
			strikes = append(strikes,
				strike{link.name + "/kill -9, 4 KiB, pausing between operations", syscall.SIGKILL, 1 << 10, paused},
				strike{link.name + "/SIGSTOP, 4 KiB, pausing between operations", syscall.SIGSTOP, 1 << 10, paused})
		}
	}
	for _, tc := range strikes {
		t.Run(tc.name, func(t *testing.T) {
			const world, victim = 4, 2
			stall := time.Second
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), "DT_COLLECTIVE_RANK=1")
			stdin, _ := child.StdinPipe()
			stdout, _ := child.StdoutPipe()
			child.Stderr = os.Stderr
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				child.Process.Signal(syscall.SIGCONT)
				child.Process.Kill()
				child.Wait()
			}()
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() {
				t.Fatal("rank process printed no address")
			}
			peers := make([]string, world)
			peers[victim] = lines.Text()
			lns := map[int]*Listener{}
			for r := range world {
				if r == victim {
					continue
				}
				ln, err := Listen("127.0.0.1:0", nil)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				lns[r], peers[r] = ln, ln.Addr()
			}
			gangSpec := Gang{Run: "chaos", Generation: 7, Peers: peers}
			cg := tc.link
			cg.Gang, cg.Rank, cg.Stall, cg.Floats = gangSpec, victim, stall, tc.floats
			json.NewEncoder(stdin).Encode(cg)

			// The in-process ranks all-reduce until the group fails.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var mu sync.Mutex
			failedAt := map[int]time.Time{}
			errs := map[int]error{}
			var wg sync.WaitGroup
			for r, ln := range lns {
				wg.Go(func() {
					g, err := Join(ctx, ln, gangSpec, r, cg.options())
					if err != nil {
						mu.Lock()
						errs[r] = err
						mu.Unlock()
						return
					}
					defer g.Close()
					buf := make([]float32, tc.floats)
					for {
						if err = g.AllReduce(ctx, buf); err != nil {
							break
						}
						time.Sleep(cg.Pause)
					}
					mu.Lock()
					errs[r], failedAt[r] = err, time.Now()
					mu.Unlock()
				})
			}
			// Let the ring run a few operations, then strike.
			for ops := 0; ops < 5 && lines.Scan(); {
				if strings.HasPrefix(lines.Text(), "op ") {
					ops++
				}
			}
			struck := time.Now()
			if err := child.Process.Signal(tc.signal); err != nil {
				t.Fatal(err)
			}
			go func() {
				for lines.Scan() {
				}
			}()
			wg.Wait()
			for r, err := range errs {
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Rank != victim {
					t.Errorf("rank %d: got %v, want a PeerError naming rank %d", r, err, victim)
					continue
				}
				latency := failedAt[r].Sub(struck)
				t.Logf("rank %d returned after %v: %v", r, latency.Round(time.Millisecond), err)
				if limit := stall + 2*time.Second; latency > limit {
					t.Errorf("rank %d took %v to notice, more than %v", r, latency, limit)
				}
			}
		})
	}
}
