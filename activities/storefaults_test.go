package activities

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/faultproxy"
	"github.com/durabletrain/durabletrain/testkit/minio"
	"github.com/durabletrain/durabletrain/testkit/minio/miniotest"
	"github.com/durabletrain/durabletrain/testkit/storeproc"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// A store that stops answering, while a gang loads its data set or saves
// its checkpoint, fails the epoch within the worker's stall timeout, as
// the store's fault (retried by a new gang), not as the user's; and once
// the store answers again, the next gang trains and commits. A data set
// whose store answers 503 is the store's fault too, not the spec's. A real MinIO
// behind a proxy that holds the requests a step picks. Without the watch,
// each step waited for ever: the heartbeat went on beating meanwhile.
func TestAHungStoreFailsTheEpochAsTheStoresFault(t *testing.T) {
	p, via := dataOnFaultyS3(t)
	const stall = 2 * time.Second
	agents, peers := newAgents(t, 2)
	for _, a := range agents {
		a.Policy.StorageRoots = append(a.Policy.StorageRoots, via.BucketURL("faults", ""))
		a.Policy.StorageStallTimeout = stall
	}
	s := spec.Training{Model: spec.Model{Hidden: []int{64}}, Dataset: spec.Dataset{URL: "s3://faults?prefix=data/"}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: "s3://faults?prefix=ckpt/"}}.WithDefaults()
	in := spec.EpochInput{Run: "hung", Peers: peers, Secret: []byte("0123456789abcdef"), Spec: s}
	under := func(f faultproxy.Fault, prefix string, methods ...string) faultproxy.Rule {
		return func(r *http.Request) faultproxy.Fault {
			if strings.HasPrefix(r.URL.Path, "/faults/"+prefix) && (len(methods) == 0 || slices.Contains(methods, r.Method)) {
				return f
			}
			return faultproxy.Pass
		}
	}
	for i, step := range []struct {
		name string
		rule faultproxy.Rule
		says string
	}{
		{"the data set's reads hang", under(faultproxy.Hang, "data/", http.MethodGet, http.MethodHead), "hung or unreachable"},
		{"the data set's reads fail (503)", under(faultproxy.Fail, "data/", http.MethodGet, http.MethodHead), "SlowDown"},
		{"the checkpoint's uploads hang", under(faultproxy.Hang, "ckpt/", http.MethodPut, http.MethodPost), "hung or unreachable"},
	} {
		t.Run(step.name, func(t *testing.T) {
			for _, a := range agents {
				// The AWS SDK waits up to 6s between its three tries of a
				// 503, moving nothing: a store that answers is no stall.
				a.Policy.StorageStallTimeout = stall
				if step.says == "SlowDown" {
					a.Policy.StorageStallTimeout = 10 * stall
				}
			}
			p.Set(step.rule)
			defer p.Set(nil)
			in.Generation = i + 1
			errs := epochWithin(t, agents, in, 15*stall)
			var app *temporal.ApplicationError
			if errs[0] == nil || !strings.Contains(errs[0].Error(), step.says) ||
				(errors.As(errs[0], &app) && (app.NonRetryable() || app.Type() == spec.ErrUser)) {
				t.Fatalf("rank 0: %v; want a retryable error, the store's, saying %q", errs[0], step.says)
			}
			if errs[1] == nil {
				t.Fatal("rank 1 reported the epoch done")
			}
		})
	}
	in.Generation = 4
	res, errs := runEpochOnAll(t, agents, in)
	if errs[0] != nil || errs[1] != nil || res[0].Checkpoint == nil {
		t.Fatalf("with the store answering again: %+v, %v", res[0], errs)
	}
	if p.Faulted() == 0 {
		t.Fatal("the proxy held no request: the test tested nothing")
	}
}

// dataOnFaultyS3 is a real MinIO holding the small Fashion-MNIST under
// data/ (uploaded through the proxy, before any fault), with a fault proxy in front of it, and the
// server as reached through the proxy.
func dataOnFaultyS3(t *testing.T) (*faultproxy.Proxy, *minio.Server) {
	t.Helper()
	p, via := miniotest.StartBehindFaults(t, "..", "faults")
	storeproc.UploadDir(t, via.BucketURL("faults", "data/"), testdata.FashionMNISTSmallDir())
	return p, via
}

// A data set is loaded once per worker for every rank and run that asks for
// it at once. One of them cancelled (its run cancelled by its user, its
// gang broken) while it was the one loading does not fail the others: they
// load it themselves. Before, they were handed its "context canceled" as
// their own run's user error, which failed the run for good.
func TestACancelledLoadDoesNotFailTheOthersWaitingOnIt(t *testing.T) {
	p, via := dataOnFaultyS3(t)
	agents, _ := newAgents(t, 1)
	a := agents[0]
	a.Policy.StorageRoots = append(a.Policy.StorageRoots, via.BucketURL("faults", ""))
	a.init()
	d := spec.Dataset{URL: "s3://faults?prefix=data/", Format: "idx"}
	held := make(chan struct{}, 16)
	p.Set(func(r *http.Request) faultproxy.Fault {
		if strings.HasPrefix(r.URL.Path, "/faults/data/") {
			held <- struct{}{}
			return faultproxy.Hang
		}
		return faultproxy.Pass
	})
	first, cancelFirst := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() {
		_, _, err := a.dataset(first, d)
		firstDone <- err
	}()
	<-held // the first is loading, and its read is held
	secondDone := make(chan error, 1)
	go func() {
		train, _, err := a.dataset(context.Background(), d)
		if err == nil && train.Len() == 0 {
			err = errors.New("an empty training split")
		}
		secondDone <- err
	}()
	time.Sleep(200 * time.Millisecond) // the second waits on the first's load
	p.Set(nil)
	cancelFirst()
	if err := <-firstDone; err == nil {
		t.Fatal("the cancelled load returned no error")
	}
	select {
	case err := <-secondDone:
		if err != nil {
			t.Fatalf("the second caller, not cancelled, got %v; want the data set", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the second caller still waits a minute after the first was cancelled")
	}
}

// epochWithin runs in's epoch on every agent, failing the test if it has
// not ended within limit.
func epochWithin(t *testing.T, agents []*Agent, in spec.EpochInput, limit time.Duration) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() {
		_, errs := runEpochOnAll(t, agents, in)
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-time.After(limit):
		t.Fatalf("the epoch had not ended %v after it started", limit)
		return nil
	}
}
