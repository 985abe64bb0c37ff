package collective

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAllReduce is one all-reduce of each size between ranks in this
// process, over shared memory and over TCP (bench allreduce runs ranks as
// processes, against peers). Sizes the small all-reduce takes are measured
// with the ring and gathered ("/gather", GatherBytes 64 KiB), side by side.
func BenchmarkAllReduce(b *testing.B) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
			for _, gather := range []int{0, 64 << 10} {
				if gather > 0 && size > 64<<10 {
					continue // the ring either way
				}
				name := fmt.Sprintf("%s/%dKiB", map[string]string{TransportAuto: "shm", TransportTCP: "tcp"}[transport], size>>10)
				if gather > 0 {
					name += "/gather"
				}
				b.Run(name, func(b *testing.B) { benchAllReduce(b, transport, size, gather) })
			}
		}
	}
}

// benchAllReduce times all-reduces of size bytes between two ranks; gather
// is Options.GatherBytes.
func benchAllReduce(b *testing.B, transport string, size, gather int) {
	groups := gang(b, 2, Options{Transport: transport, GatherBytes: gather})
	bufs := [][]float32{make([]float32, size/4), make([]float32, size/4)}
	b.SetBytes(int64(size))
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < b.N && err == nil; i++ {
			err = groups[1].AllReduce(context.Background(), bufs[1])
		}
		done <- err
	}()
	for i := 0; i < b.N; i++ {
		if err := groups[0].AllReduce(context.Background(), bufs[0]); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAddInto is the sum of one received 512 KiB chunk into its
// buffer (addInto), in cache.
func BenchmarkAddInto(b *testing.B) {
	dst, src := make([]float32, 128<<10), make([]float32, 128<<10)
	b.SetBytes(4 * int64(len(dst)))
	for b.Loop() {
		addInto(dst, src)
	}
}

// BenchmarkGatherOverLinks is a 4 KiB all-reduce of 4 and 8 ranks in this
// process over TCP, gathered around the ring and over skip links, side by
// side (bench allreduce -gather-links measures it between processes).
func BenchmarkGatherOverLinks(b *testing.B) {
	for _, world := range []int{4, 8} {
		for _, links := range []bool{false, true} {
			b.Run(fmt.Sprintf("ranks=%d/links=%v", world, links), func(b *testing.B) {
				groups := gang(b, world, Options{Transport: TransportTCP, GatherBytes: 64 << 10, GatherLinks: links})
				b.SetBytes(4 << 10)
				b.ResetTimer()
				errs := each(groups, func(r int, g *Group) error {
					buf := make([]float32, 1<<10)
					for range b.N {
						if err := g.AllReduce(context.Background(), buf); err != nil {
							return err
						}
					}
					return nil
				})
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
