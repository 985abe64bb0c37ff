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
	once        sync.Once
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
// the user's (a wrong URL, a missing or malformed file, an unknown format).
func (a *Agent) dataset(ctx context.Context, d spec.Dataset) (*dataset.Set, *dataset.Set, error) {
	c := &a.data
	c.mu.Lock()
	if c.m == nil {
		c.m = map[spec.Dataset]*loadedData{}
	}
	l := c.m[d]
	if l == nil {
		l = &loadedData{}
		c.m[d] = l
	}
	c.tick++
	l.used = c.tick
	c.evictLocked(maxCachedDatasets(len(a.Slots)))
	c.mu.Unlock()
	l.once.Do(func() {
		loader, err := a.Datasets.Lookup(d.Format)
		if err != nil {
			l.err = err
			return
		}
		url, err := a.Policy.Resolve("dataset.url", d.URL)
		if err != nil {
			l.err = err
			return
		}
		l.train, l.test, l.err = loader.Load(dataset.WithMemoryLimit(a.Policy.StorageContext(ctx), a.Policy.DatasetMemory()), url)
	})
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
