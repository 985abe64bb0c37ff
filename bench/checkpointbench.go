package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
	stall := fs.Bool("stall", true, "also measure what a checkpoint costs training (native trainer of about -size of state)")
	data := fs.String("data", dataset.DefaultURL, "the data set the stall measurement trains on")
	fs.Parse(args)
	size, err := parseSize(*sizeFlag)
	if err != nil || size < 1<<20 {
		return fmt.Errorf("-size: %q; want at least 1M", *sizeFlag)
	}
	dir := *dirFlag
	if dir == "" {
		if dir, err = os.MkdirTemp("", "durabletrain-ckpt-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	ctx := context.Background()
	state := make([]byte, size)
	rand.Read(state)
	const chunk = 4 << 20
	ddFile := filepath.Join(dir, "dd.bin")
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
	var ddWrite, ddRead, save, load, restore, restoreOnce []float64
	for rep := range *repeat {
		ddRound := func() error { // dd: raw disk, synced
			// Removed at the end of the round, as ours removes its store:
			// removing it just before writing would hand dd the page-cache
			// pages its last file freed, which on a VM whose host takes
			// freed pages back (free page reporting, 2 s after) are the only
			// ones backed, and ours would write into cold ones.
			defer os.Remove(ddFile)
			if err := timed(&ddWrite, func() error {
				return command("dd", "if="+ddSource, "of="+ddFile, fmt.Sprint("bs=", chunk), fmt.Sprint("count=", size/chunk), "conv=fdatasync")
			}); err != nil {
				return err
			}
			dropCache(ddFile)
			return timed(&ddRead, func() error { return command("dd", "if="+ddFile, "of=/dev/null", fmt.Sprint("bs=", chunk)) })
		}
		oursRound := func() error { // ours: hash while writing, fsync, manifest last
			root := filepath.Join(dir, fmt.Sprint("store-", rep))
			store, err := checkpoint.Open(ctx, "file://"+root+"?create_dir=1&metadata=skip", nil)
			if err != nil {
				return err
			}
			defer os.RemoveAll(root)
			defer store.Close()
			if err := timed(&save, func() error {
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
			if err := timed(&load, func() error { return readAll(ctx, c) }); err != nil {
				return err
			}
			// Restore, as a resuming run does it: find the latest verified, then load it.
			dropCache(objPath)
			if err := timed(&restore, func() error {
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
			return timed(&restoreOnce, func() error {
				_, err := store.RestoreLatest(ctx, "bench", func(c *checkpoint.Checkpoint) error { return readAll(ctx, c) })
				return err
			})
		}
		// Which goes first alternates, so that neither always follows the
		// other's writeback (on 2026-11-24 the order made no difference here).
		first, second := ddRound, oursRound
		if rep%2 == 1 {
			first, second = oursRound, ddRound
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
	}
	gbps := func(secs []float64) float64 { return float64(size) / median(secs) / 1e9 }
	// spread: the slowest and fastest round, GB/s.
	spread := func(secs []float64) string {
		return fmt.Sprintf("%.2f–%.2f", float64(size)/slices.Max(secs)/1e9, float64(size)/slices.Min(secs)/1e9)
	}
	// ratios: ours against dd round by round (the same round's dd), lowest–highest.
	ratios := func(ours, dd []float64) string {
		r := make([]float64, len(ours))
		for i := range ours {
			r[i] = dd[i] / ours[i]
		}
		return fmt.Sprintf("%.2f–%.2fx", slices.Min(r), slices.Max(r))
	}
	row := func(what string, ours, dd []float64, target string) []string {
		return []string{what, fmt.Sprintf("%.2f", gbps(ours)), spread(ours), fmt.Sprintf("%.2f", gbps(dd)), spread(dd),
			fmt.Sprintf("%.2fx", gbps(ours)/gbps(dd)), ratios(ours, dd), target}
	}
	fmt.Printf("# %s state on %s, median of %d interleaved runs (dd first in odd rounds, ours first in even ones); page cache dropped (fadvise) before every read; dd writes the same bytes from %s, 4 MiB at a time, and reads them 4 MiB at a time, as ours; each removes what it wrote at the end of its round\n\n", humanBytes(size), dir, *repeat, ddSource)
	table([]string{"operation", "ours GB/s", "spread", "dd GB/s", "spread", "ours / dd", "per round", "target"}, [][]string{
		row("save: write + BLAKE3 + fsync + manifest (dd: conv=fdatasync)", save, ddWrite, ">= 0.8x"),
		row("load: read with streaming BLAKE3 verification", load, ddRead, ">= 0.8x"),
		row("restore: LatestVerified (full verify) + load", restore, ddRead, ""),
		row("restore: RestoreLatest (verify while loading)", restoreOnce, ddRead, ">= 0.8x"),
	})
	if *stall {
		state = nil
		return benchStall(ctx, dir, size, *repeat, *data)
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

// timed runs f once the disk has settled and adds its seconds to into.
func timed(into *[]float64, f func() error) error {
	settle()
	t := time.Now()
	if err := f(); err != nil {
		return err
	}
	*into = append(*into, time.Since(t).Seconds())
	return nil
}

// command runs a program, its output in the error if it fails.
func command(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, out)
	}
	return nil
}
