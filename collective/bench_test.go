package collective

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAllReduce is one all-reduce of each size between ranks in this
// process, over shared memory and over TCP (bench allreduce runs ranks as
// processes, against peers).
func BenchmarkAllReduce(b *testing.B) {
	for _, transport := range []string{TransportAuto, TransportTCP} {
		for _, size := range []int{4 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", map[string]string{TransportAuto: "shm", TransportTCP: "tcp"}[transport], size>>10), func(b *testing.B) {
				groups := gang(b, 2, Options{Transport: transport})
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
			})
		}
	}
}
