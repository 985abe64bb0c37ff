package checkpoint

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// BenchmarkSave writes a 256 MiB object to a file:// store in each format,
// in 4 MiB writes, and reports the CPU time a GB of it took (cpu-s/GB):
// what a save in the background takes from training beside it.
func BenchmarkSave(b *testing.B) {
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	b.Run("raw", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, _ := os.Create(dir + "/raw")
			for off := 0; off < len(data); off += 4 << 20 {
				f.Write(data[off : off+4<<20])
			}
			f.Sync()
			f.Close()
			os.Remove(dir + "/raw")
		}
	})
	// Each format in 4 MiB writes, as dd's bs=4M; "whole": in one write, as
	// a trainer's snapshot is saved (trainer.MemState.WriteTo); "signed":
	// on a store with a key (format 3: a GMAC on every block).
	for _, c := range []struct {
		name   string
		format int
		per    int
		signed bool
	}{
		{"format1", 1, 4 << 20, false}, {"format2", 2, 4 << 20, false}, {"format2-whole", 2, len(data), false},
		{"format3", 3, 4 << 20, false}, {"format3-whole", 3, len(data), false}, {"format3-signed-whole", 3, len(data), true},
	} {
		format, per := c.format, c.per
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			s := benchStore(b, c.signed)
			b.SetBytes(int64(len(data)))
			cpu0, ops := cpuSeconds(), 0
			for i := 0; b.Loop(); i++ {
				ops++
				w, _ := s.Begin(ctx, "r", 1, i)
				w.format = format
				o, _ := w.Create(ctx, "o")
				for off := 0; off < len(data); off += per {
					o.Write(data[off : off+per])
				}
				if err := o.Close(); err != nil {
					b.Fatal(err)
				}
				if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cpuSeconds()-cpu0)/(float64(ops)*float64(len(data))/1e9), "cpu-s/GB")
		})
	}
}

// BenchmarkLoad reads a 256 MiB object back through verification, from
// the disk (it was written with direct I/O), in 4 MiB reads, in formats 2
// and 3 (format 3 signed: a GMAC checked on every block too), and reports
// the CPU time a GB of it took.
func BenchmarkLoad(b *testing.B) {
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name   string
		format int
		signed bool
	}{{"format2", 2, false}, {"format3", 3, false}, {"format3-signed", 3, true}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			s := benchStore(b, c.signed)
			w, _ := s.Begin(ctx, "r", 1, 0)
			w.format = c.format
			o, _ := w.Create(ctx, "o")
			o.Write(data)
			o.Close()
			if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
				b.Fatal(err)
			}
			ck, err := s.Committed(ctx, "r", ID(1, 0))
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 4<<20)
			b.SetBytes(int64(len(data)))
			cpu0, ops := cpuSeconds(), 0
			for b.Loop() {
				ops++
				r, _ := ck.Open(ctx, "o")
				for {
					if _, err := r.Read(buf); err != nil {
						if err != io.EOF {
							b.Fatal(err)
						}
						break
					}
				}
				r.Close()
			}
			b.ReportMetric((cpuSeconds()-cpu0)/(float64(ops)*float64(len(data))/1e9), "cpu-s/GB")
		})
	}
}

// benchStore is a file:// store in a folder of b's, with a pool key if signed.
func benchStore(b *testing.B, signed bool) *Store {
	s, err := Open(context.Background(), bloburl.FromPath(b.TempDir())+"?metadata=skip", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if signed {
		s.Sign([]byte("the-pool-key-of-at-least-32-bytes-long"))
	}
	return s
}

// BenchmarkSaveManySmallObjects writes a checkpoint of 1,000 objects of
// 4 KiB each to a file:// store (an exec program's directory of small
// files) and reports the CPU time and the bytes allocated per object:
// what an object costs beyond its data.
func BenchmarkSaveManySmallObjects(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b, false)
	data := make([]byte, 4<<10)
	const objects = 1000
	cpu0, ops := cpuSeconds(), 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ops++
		w, _ := s.Begin(ctx, "r", 1, i)
		for k := range objects {
			o, err := w.Create(ctx, fmt.Sprintf("files/%04d", k))
			if err != nil {
				b.Fatal(err)
			}
			o.Write(data)
			if err := o.Close(); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpuSeconds()-cpu0)/float64(ops*objects)*1e6, "cpu-µs/object")
}
