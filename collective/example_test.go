package collective_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/durabletrain/durabletrain/collective"
)

// Two ranks (here goroutines; normally processes on different hosts) join a
// gang and sum their gradients.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each worker process listens once and shares the listener among its ranks.
	ln0, _ := collective.Listen("127.0.0.1:0", nil)
	ln1, _ := collective.Listen("127.0.0.1:0", nil)
	defer ln0.Close()
	defer ln1.Close()
	gang := collective.Gang{Run: "fashion-mnist-1", Generation: 1, Peers: []string{ln0.Addr(), ln1.Addr()}}
	opts := collective.Options{Secret: []byte("per-run secret, 16+ bytes")}

	grads := [][]float32{{1, 2, 3}, {10, 20, 30}}
	var wg sync.WaitGroup
	for rank, ln := range []*collective.Listener{ln0, ln1} {
		wg.Go(func() {
			g, err := collective.Join(ctx, ln, gang, rank, opts)
			if err != nil {
				panic(err)
			}
			defer g.Close()
			if err := g.AllReduce(ctx, grads[rank]); err != nil {
				panic(err) // a *collective.PeerError names the rank that failed
			}
		})
	}
	wg.Wait()
	fmt.Println(grads[0], grads[1])
	// Output: [11 22 33] [11 22 33]
}
