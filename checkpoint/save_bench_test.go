package checkpoint

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
)

// BenchmarkSave writes a 256 MiB object to a file:// store in each format.
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
	for _, format := range []int{1, 2} {
		b.Run(fmt.Sprintf("format%d", format), func(b *testing.B) {
			ctx := context.Background()
			s, _ := Open(ctx, "file://"+b.TempDir()+"?metadata=skip", nil)
			defer s.Close()
			b.SetBytes(int64(len(data)))
			for i := 0; b.Loop(); i++ {
				w, _ := s.Begin(ctx, "r", 1, i)
				w.format = format
				o, _ := w.Create(ctx, "o")
				for off := 0; off < len(data); off += 4 << 20 {
					o.Write(data[off : off+4<<20])
				}
				if err := o.Close(); err != nil {
					b.Fatal(err)
				}
				if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad reads a 256 MiB object back through verification.
func BenchmarkLoad(b *testing.B) {
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ctx := context.Background()
	s, _ := Open(ctx, "file://"+b.TempDir()+"?metadata=skip", nil)
	defer s.Close()
	w, _ := s.Begin(ctx, "r", 1, 0)
	o, _ := w.Create(ctx, "o")
	o.Write(data)
	o.Close()
	w.Commit(ctx, Info{WorldSize: 1})
	c, err := s.Committed(ctx, "r", ID(1, 0))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		r, _ := c.Open(ctx, "o")
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
}
