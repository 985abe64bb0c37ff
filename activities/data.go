package activities

import (
	"context"
	"sync"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"github.com/durabletrain/durabletrain/spec"
)

// dataCache loads each data set once per worker, however many of its ranks
// and runs ask for it, and forgets a load that failed so the next ask retries.
// It keeps at most maxCachedDatasets(slots) data sets, forgetting the least
// recently asked for: runs naming ever new data sets cannot grow a worker
// without bound (ranks still training keep theirs until they let go).
type dataCache struct {
	mu   sync.Mutex
	m    map[spec.Dataset]*loadedData
	tick uint64
}

type loadedData struct {
	// loading is held by the one caller loading the data set; the others
	// wait for it, or for their own cancellation.
	loading     chan struct{}
	done        bool // loaded, or failed for a reason of its own
	train, test *dataset.Set
	err         error
	used        uint64 // the cache's tick when last asked for
}

// maxCachedDatasets is two data sets per slot, at least two.
func maxCachedDatasets(slots int) int { return max(2, 2*slots) }

// evictLocked forgets the least recently used data sets beyond limit.
func (c *dataCache) evictLocked(limit int) {
	for len(c.m) > limit {
		var oldest spec.Dataset
		var at uint64 = ^uint64(0)
		for d, l := range c.m {
			if l.used < at {
				oldest, at = d, l.used
			}
		}
		delete(c.m, oldest)
	}
}

// dataset loads the spec's data set with its registered format; a failure is
// the user's (a wrong URL, a missing or malformed file, an unknown format),
// unless it is the store's (blobwatch: a stall, an error status), which a
// new gang retries. The callers asking at once share one load; one cancelled
// while it loads returns its cancellation, and the next loads instead.
func (a *Agent) dataset(ctx context.Context, d spec.Dataset) (*dataset.Set, *dataset.Set, error) {
	c := &a.data
	c.mu.Lock()
	if c.m == nil {
		c.m = map[spec.Dataset]*loadedData{}
	}
	l := c.m[d]
	if l == nil {
		l = &loadedData{loading: make(chan struct{}, 1)}
		c.m[d] = l
	}
	c.tick++
	l.used = c.tick
	c.evictLocked(maxCachedDatasets(len(a.Slots)))
	c.mu.Unlock()
	select {
	case l.loading <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	if !l.done {
		train, test, err := a.loadDataset(ctx, d)
		if err != nil && ctx.Err() != nil {
			// Cancelled while loading: that is this caller's end, not the
			// data set's; whoever waits loads it with a context of its own.
			<-l.loading
			return nil, nil, ctx.Err()
		}
		l.train, l.test, l.err, l.done = train, test, err, true
	}
	<-l.loading
	if l.err != nil {
		c.mu.Lock()
		if c.m[d] == l {
			delete(c.m, d) // try again next time
		}
		c.mu.Unlock()
		if blobwatch.IsStoreFailure(l.err) {
			return nil, nil, l.err // the store's failure, not the data set's: a worker fault, retried
		}
		return nil, nil, userError(l.err)
	}
	return l.train, l.test, nil
}

// loadDataset reads the data set with its registered format, under the
// worker's policy.
func (a *Agent) loadDataset(ctx context.Context, d spec.Dataset) (*dataset.Set, *dataset.Set, error) {
	loader, err := a.Datasets.Lookup(d.Format)
	if err != nil {
		return nil, nil, err
	}
	url, err := a.Policy.Resolve("dataset.url", d.URL)
	if err != nil {
		return nil, nil, err
	}
	return loader.Load(dataset.WithMemoryLimit(a.Policy.StorageContext(ctx), a.Policy.DatasetMemory()), url)
}
