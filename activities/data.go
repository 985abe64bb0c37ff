package activities

import (
	"context"
	"sync"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
)

// dataCache loads each data set once per worker, however many of its ranks
// and runs ask for it, and forgets a load that failed so the next ask retries.
type dataCache struct {
	mu sync.Mutex
	m  map[spec.Dataset]*loadedData
}

type loadedData struct {
	once        sync.Once
	train, test *dataset.Set
	err         error
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
		l.train, l.test, l.err = loader.Load(ctx, url)
	})
	if l.err != nil {
		c.mu.Lock()
		if c.m[d] == l {
			delete(c.m, d) // try again next time
		}
		c.mu.Unlock()
		return nil, nil, userError(l.err)
	}
	return l.train, l.test, nil
}
