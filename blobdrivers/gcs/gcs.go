// Package gcs registers durabletrain's opener for gs:// URLs that name their
// own endpoint: gs://bucket?endpoint=http://host:port, as a worker's
// -storage-roots gives a GCS-compatible store (an emulator such as
// fake-gcs-server, or a private endpoint), with ?anonymous=true for one that
// takes no credentials. gocloud's gcsblob reads an endpoint only from the
// process-wide STORAGE_EMULATOR_HOST, which would send every gs:// URL of the
// process there; here each root carries its own, as s3:// roots do. A gs://
// URL without ?endpoint= goes to gcsblob unchanged (Google Cloud Storage,
// with the credentials of GOOGLE_APPLICATION_CREDENTIALS or the machine's).
// Package blobdrivers imports it.
package gcs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"cloud.google.com/go/storage"
	"gocloud.dev/blob"
	"gocloud.dev/blob/gcsblob" // gs:// without ?endpoint=
	"google.golang.org/api/option"

	"github.com/durabletrain/durabletrain/internal/blobopen"
)

// EndpointParam is the query parameter that names the store's endpoint.
const EndpointParam = "endpoint"

// params are the query parameters a gs:// URL with an endpoint may have.
var params = []string{EndpointParam, "anonymous", "prefix"}

func init() { blobopen.Register(gcsblob.Scheme, open) }

// clients are the storage clients opened so far, one per endpoint and
// authentication: a bucket opened with a client of its own does not close it,
// so each is made once and shared.
var clients sync.Map // clientKey -> *storage.Client

type clientKey struct {
	endpoint  string
	anonymous bool
}

var clientMu sync.Mutex

func open(ctx context.Context, u *url.URL) (*blob.Bucket, bool, error) {
	q := u.Query()
	if !q.Has(EndpointParam) {
		return nil, false, nil
	}
	for k := range q {
		if !slices.Contains(params, k) {
			return nil, true, fmt.Errorf("open bucket %s: unknown query parameter %q in a gs:// URL with ?%s= (want only %s)", redacted(u), k, EndpointParam, strings.Join(params, ", "))
		}
	}
	ep, err := url.Parse(q.Get(EndpointParam))
	if err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "" || (ep.Path != "" && ep.Path != "/") || ep.RawQuery != "" {
		return nil, true, fmt.Errorf("open bucket %s: ?%s=%q; want the store's base URL, http://host:port or https://host", redacted(u), EndpointParam, q.Get(EndpointParam))
	}
	key := clientKey{endpoint: ep.Scheme + "://" + ep.Host}
	if a := q.Get("anonymous"); a != "" {
		if key.anonymous, err = strconv.ParseBool(a); err != nil {
			return nil, true, fmt.Errorf("open bucket %s: ?anonymous=%q; want true or false", redacted(u), a)
		}
	}
	c, err := client(ctx, key)
	if err != nil {
		return nil, true, fmt.Errorf("open bucket %s: %w", redacted(u), err)
	}
	b, err := gcsblob.OpenBucket(ctx, nil, u.Host, &gcsblob.Options{Client: c})
	if err != nil {
		return nil, true, err
	}
	if p := q.Get("prefix"); p != "" {
		b = blob.PrefixedBucket(b, p)
	}
	return b, true, nil
}

// client is the storage client for key, made on first use.
func client(ctx context.Context, key clientKey) (*storage.Client, error) {
	if c, ok := clients.Load(key); ok {
		return c.(*storage.Client), nil
	}
	clientMu.Lock()
	defer clientMu.Unlock()
	if c, ok := clients.Load(key); ok {
		return c.(*storage.Client), nil
	}
	opts := []option.ClientOption{option.WithEndpoint(key.endpoint + "/storage/v1/")}
	if key.anonymous {
		opts = append(opts, option.WithoutAuthentication())
	}
	// The client outlives the call that made it: context.WithoutCancel keeps
	// a cancelled first caller from breaking it for the others.
	c, err := storage.NewClient(context.WithoutCancel(ctx), opts...)
	if err != nil {
		return nil, err
	}
	// Against an endpoint that refuses connections the client's own retries
	// would go on until the call's context ends (an upload's retries heed no
	// attempt limit), minutes of the worker's storage stall timeout: a store
	// that is not listening fails the call at once, and the run's failure
	// handling retries it; other errors are retried as the client would,
	// three times at most (as the AWS SDK does).
	c.SetRetry(storage.WithMaxAttempts(3), storage.WithErrorFunc(func(err error) bool {
		return !errors.Is(err, syscall.ECONNREFUSED) && storage.ShouldRetry(err)
	}))
	clients.Store(key, c)
	return c, nil
}

// redacted is u without its query's values (the endpoint is the worker's
// business, not a run's error message's).
func redacted(u *url.URL) string { return u.Scheme + "://" + u.Host }
