package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/dataset"
)

func benchCheckpoint(args []string) error {
	fs := flag.NewFlagSet("checkpoint", flag.ExitOnError)
	sizeFlag := fs.String("size", "1G", "state size (K, M, G suffixes)")
	dirFlag := fs.String("dir", "", "folder on the disk to measure (default: a temporary folder)")
	repeat := fs.Int("repeat", 3, "interleaved runs; the table shows medians")
	loadFlag := fs.String("load", "idle,loaded", "idle, loaded (a CPU-bound process on every core beside every side, as in bench allreduce) or both (idle,loaded)")
	stall := fs.Bool("stall", true, "also measure what a checkpoint costs training (native trainer of about -size of state)")
	stallOnly := fs.Bool("stall-only", false, "measure only what a checkpoint costs training")
	stallDirect := fs.String("stall-direct-io", "on", "the stall measurement's store: direct_io=on (objects bypass the page cache) or off")
	data := fs.String("data", dataset.DefaultURL, "the data set the stall measurement trains on")
	fs.Parse(args)
	size, err := parseSize(*sizeFlag)
	if err != nil || size < 1<<20 {
		return fmt.Errorf("-size: %q; want at least 1M", *sizeFlag)
	}
	loads, err := parseLoads(*loadFlag)
	if err != nil {
		return err
	}
	if *stallDirect != "on" && *stallDirect != "off" {
		return fmt.Errorf("-stall-direct-io: %q; want on or off", *stallDirect)
	}
	dir := *dirFlag
	if dir == "" {
		if dir, err = os.MkdirTemp("", "durabletrain-ckpt-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	// A storage URL names an absolute path (checkpoint.Open refuses others).
	if dir, err = filepath.Abs(dir); err != nil {
		return fmt.Errorf("-dir: %w", err)
	}
	ctx := context.Background()
	if *stallOnly {
		return benchStall(ctx, dir, size, *repeat, *data, *stallDirect)
	}
	state := make([]byte, size)
	rand.Read(state)
	// dd copies the same bytes from memory (tmpfs), not zeros: a virtual
	// disk may store zeros for less than other bytes.
	ddSource := "/dev/zero"
	if f, err := os.CreateTemp("/dev/shm", "durabletrain-ckpt-bench-"); err == nil {
		_, werr := f.Write(state)
		f.Close()
		if werr == nil {
			ddSource = f.Name()
		}
		defer os.Remove(f.Name())
	}
	for _, l := range loads {
		stop := startLoad(l == "loaded")
		m, err := measureCheckpointRounds(ctx, dir, state, ddSource, *repeat)
		stop()
		if err != nil {
			return fmt.Errorf("%s: %w", l, err)
		}
		printCheckpointTable(l, m, size, *repeat, dir, ddSource)
	}
	if *stall {
		state = nil
		return benchStall(ctx, dir, size, *repeat, *data, *stallDirect)
	}
	return nil
}

func readAll(ctx context.Context, c *checkpoint.Checkpoint) error {
	r, err := c.Open(ctx, "state.bin")
	if err != nil {
		return err
	}
	defer r.Close()
	buf := make([]byte, 4<<20) // dd's bs=4M: io.Discard's own ReadFrom would read 8 KiB at a time
	for {
		if _, err := r.Read(buf); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// copyAll reads the bench's object with io.Copy to io.Discard, which takes
// the reader's WriteTo: no copy into a buffer of the caller's, as dd's reads
// go to /dev/null.
func copyAll(ctx context.Context, c *checkpoint.Checkpoint) error {
	r, err := c.Open(ctx, "state.bin")
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(io.Discard, r)
	return err
}

// settle lets the disk finish what the last operation left it (a virtual
// disk's host may still be writing after fdatasync returns), so that no
// operation pays for the one before it: every timed operation starts after it.
func settle() {
	unix.Sync()
	time.Sleep(2 * time.Second)
}

// dropCache evicts a file from the page cache so the next read comes from disk.
func dropCache(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// timed runs f once the disk has settled and adds its seconds to into, and
// the CPU seconds it took to cpuOf[into]: this process's and those of the
// children it waited for (dd), user and system.
func timed(into *[]float64, f func() error) error {
	settle()
	t, cpu := time.Now(), cpuSeconds()
	if err := f(); err != nil {
		return err
	}
	*into = append(*into, time.Since(t).Seconds())
	cpuOf[into] = append(cpuOf[into], cpuSeconds()-cpu)
	return nil
}

// cpuOf holds the CPU seconds of each round that timed measured, by the
// slice it added the round's seconds to.
var cpuOf = map[*[]float64][]float64{}

// cpuSeconds is the CPU time of this process and of its waited-for children.
func cpuSeconds() float64 {
	var self, children unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &self)
	unix.Getrusage(unix.RUSAGE_CHILDREN, &children)
	sum := 0.0
	for _, u := range []unix.Rusage{self, children} {
		sum += float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
	}
	return sum
}

// command runs a program, its output in the error if it fails.
func command(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, out)
	}
	return nil
}

// checkpointRounds holds each round's seconds, ours and dd's.
type checkpointRounds struct {
	ddWrite, ddRead                  []float64 // dd through the page cache (conv=fdatasync)
	ddWriteDirect, ddReadDirect      []float64 // dd with oflag=direct / iflag=direct
	save, load, restore, restoreOnce []float64
	loadStreamed                     []float64 // ours read by io.Copy to io.Discard (the reader's WriteTo), as dd's to /dev/null
	saveCached, loadCached           []float64 // ours with direct_io=off: through the page cache
}

// measureCheckpointRounds runs repeat interleaved rounds of dd and ours on
// dir: in each, dd (through the cache and direct), ours, and ours through
// the page cache (direct_io=off), in an order that rotates by round.
func measureCheckpointRounds(ctx context.Context, dir string, state []byte, ddSource string, repeat int) (*checkpointRounds, error) {
	const chunk = 4 << 20
	size := len(state)
	ddFile := filepath.Join(dir, "dd.bin")
	m := &checkpointRounds{}
	dd := func(write, read *[]float64, wflags, rflags []string) error {
		// Removed at the end, as ours removes its store: removing it just
		// before writing would hand dd the page-cache pages its last file
		// freed, which on a VM whose host takes freed pages back (free page
		// reporting, 2 s after) are the only ones backed, and ours would
		// write into cold ones.
		defer os.Remove(ddFile)
		args := append([]string{"if=" + ddSource, "of=" + ddFile, fmt.Sprint("bs=", chunk), fmt.Sprint("count=", size/chunk)}, wflags...)
		if err := timed(write, func() error { return command("dd", args...) }); err != nil {
			return err
		}
		dropCache(ddFile)
		args = append([]string{"if=" + ddFile, "of=/dev/null", fmt.Sprint("bs=", chunk)}, rflags...)
		return timed(read, func() error { return command("dd", args...) })
	}
	ddRound := func(int) error {
		if err := dd(&m.ddWrite, &m.ddRead, []string{"conv=fdatasync"}, nil); err != nil {
			return err
		}
		return dd(&m.ddWriteDirect, &m.ddReadDirect, []string{"oflag=direct", "conv=fdatasync"}, []string{"iflag=direct"})
	}
	// ours: hash while writing, fsync, manifest last; then read it back
	// three ways. cached: with direct_io=off, save and load only.
	ours := func(rep int, cached bool) error {
		root := filepath.Join(dir, fmt.Sprint("store-", rep))
		url := fileURL(root, "create_dir=1&metadata=skip")
		save, load := &m.save, &m.load
		if cached {
			url += "&" + checkpoint.DirectIOParam + "=off"
			save, load = &m.saveCached, &m.loadCached
		}
		store, err := checkpoint.Open(ctx, url, nil)
		if err != nil {
			return err
		}
		defer os.RemoveAll(root)
		defer store.Close()
		if err := timed(save, func() error {
			w, err := store.Begin(ctx, "bench", 1, 0)
			if err != nil {
				return err
			}
			ow, err := w.Create(ctx, "state.bin")
			if err != nil {
				return err
			}
			for off := 0; off < size; off += chunk {
				if _, err := ow.Write(state[off:min(off+chunk, size)]); err != nil {
					return err
				}
			}
			if err := ow.Close(); err != nil {
				return err
			}
			_, err = w.Commit(ctx, checkpoint.Info{WorldSize: 1})
			return err
		}); err != nil {
			return err
		}
		// Load: read the object back, verifying size and hash as it streams.
		objPath := filepath.Join(root, "bench", checkpoint.ID(1, 0), "state.bin")
		dropCache(objPath)
		c, err := store.Get(ctx, checkpoint.Ref{Run: "bench", ID: checkpoint.ID(1, 0)}) // verifies: a full read
		if err != nil {
			return err
		}
		dropCache(objPath)
		if err := timed(load, func() error { return readAll(ctx, c) }); err != nil {
			return err
		}
		if cached {
			return nil
		}
		// Load again, the blocks handed to a writer from where they were read.
		dropCache(objPath)
		if err := timed(&m.loadStreamed, func() error { return copyAll(ctx, c) }); err != nil {
			return err
		}
		// Restore, as a resuming run does it: find the latest verified, then load it.
		dropCache(objPath)
		if err := timed(&m.restore, func() error {
			c, err := store.LatestVerified(ctx, "bench")
			if err != nil {
				return err
			}
			return readAll(ctx, c)
		}); err != nil {
			return err
		}
		// RestoreLatest: verify while loading, in one read.
		dropCache(objPath)
		return timed(&m.restoreOnce, func() error {
			_, err := store.RestoreLatest(ctx, "bench", func(c *checkpoint.Checkpoint) error { return readAll(ctx, c) })
			return err
		})
	}
	sides := []func(int) error{
		ddRound,
		func(rep int) error { return ours(rep, false) },
		func(rep int) error { return ours(rep, true) },
	}
	for rep := range repeat {
		// Which goes first rotates, so that none always follows another's
		// writeback (on 2026-11-24 the order made no difference here).
		for k := range sides {
			if err := sides[(rep+k)%len(sides)](rep); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// printCheckpointTable prints one sitting's table: ours against dd, each
// operation against the faster of dd through the page cache and dd direct
// in the median.
func printCheckpointTable(load string, m *checkpointRounds, size, repeat int, dir, ddSource string) {
	gbps := func(secs []float64) float64 { return float64(size) / median(secs) / 1e9 }
	// spread: the slowest and fastest round, GB/s.
	spread := func(secs []float64) string {
		return fmt.Sprintf("%.2f–%.2f", float64(size)/slices.Max(secs)/1e9, float64(size)/slices.Min(secs)/1e9)
	}
	// ratios: ours against the same round's faster dd, lowest–highest.
	ratios := func(ours, dd, ddDirect []float64) string {
		r := make([]float64, len(ours))
		for i := range ours {
			r[i] = min(dd[i], ddDirect[i]) / ours[i]
		}
		return fmt.Sprintf("%.2f–%.2fx", slices.Min(r), slices.Max(r))
	}
	// cpu: the median CPU seconds a GB of the rounds timed added to secs.
	cpu := func(secs *[]float64) string {
		return fmt.Sprintf("%.2f", median(cpuOf[secs])/(float64(size)/1e9))
	}
	row := func(what string, ours, dd, ddDirect *[]float64, target string) []string {
		best := max(gbps(*dd), gbps(*ddDirect))
		return []string{what, fmt.Sprintf("%.2f", gbps(*ours)), spread(*ours),
			fmt.Sprintf("%.2f", gbps(*dd)), spread(*dd), fmt.Sprintf("%.2f", gbps(*ddDirect)), spread(*ddDirect),
			fmt.Sprintf("%.2fx", gbps(*ours)/best), ratios(*ours, *dd, *ddDirect), target,
			cpu(ours), cpu(ddDirect)}
	}
	fmt.Printf("\n## %s\n\n", load)
	fmt.Printf("# %s state on %s, median of %d interleaved rounds (the order of dd, ours and ours with direct_io=off rotates by round); page cache dropped (fadvise) before every read; dd writes the same bytes from %s, 4 MiB at a time, and reads them 4 MiB at a time, as ours, through the page cache and with oflag/iflag=direct; each removes what it wrote at the end of its round; CPU s/GB: user and system seconds a GB, ours in this process, dd's its own (a write's includes reading its source from tmpfs; the median round); loaded: one CPU-bound process per core (%d) beside every side\n\n", humanBytes(size), dir, repeat, ddSource, runtime.NumCPU())
	table([]string{"operation", "ours GB/s", "spread", "dd GB/s", "spread", "dd direct GB/s", "spread", "ours / best dd", "per round", "target", "ours CPU s/GB", "dd direct CPU s/GB"}, [][]string{
		row("save: write + XXH3 + fsync + manifest (dd: conv=fdatasync)", &m.save, &m.ddWrite, &m.ddWriteDirect, ">= 0.8x"),
		row("save, through the page cache (direct_io=off)", &m.saveCached, &m.ddWrite, &m.ddWriteDirect, ""),
		row("load: read with streaming XXH3 verification, into the caller's 4 MiB buffer (Read)", &m.load, &m.ddRead, &m.ddReadDirect, ">= 0.8x"),
		row("load, handed to a writer from the read buffer (io.Copy: WriteTo; dd: of=/dev/null)", &m.loadStreamed, &m.ddRead, &m.ddReadDirect, ">= 0.8x"),
		row("load, through the page cache (direct_io=off)", &m.loadCached, &m.ddRead, &m.ddReadDirect, ""),
		row("restore: LatestVerified (full verify) + load", &m.restore, &m.ddRead, &m.ddReadDirect, ""),
		row("restore: RestoreLatest (verify while loading)", &m.restoreOnce, &m.ddRead, &m.ddReadDirect, ">= 0.8x"),
	})
}

// fileURL is the file:// URL of an absolute path, escaped (a space or a '#'
// in a folder's name is legal there, not in a URL), with a query.
func fileURL(path, query string) string {
	return (&neturl.URL{Scheme: "file", Path: path, RawQuery: query}).String()
}
