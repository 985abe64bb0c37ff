package checkpoint

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"

	"gocloud.dev/blob"
)

// EventsDir is where a run's TensorBoard event files live, beside its
// checkpoints: `tensorboard --logdir <storage>/<run>/tensorboard`.
const EventsDir = "tensorboard"

// MaxEventFileBytes bounds one event file, written or read.
const MaxEventFileBytes = 16 << 20

var eventFilePattern = regexp.MustCompile(`^events\.out\.tfevents\.[A-Za-z0-9._-]{1,150}$`)

// WriteEvents stores one event file of run (package tensorboard encodes
// it). The blob drivers make it appear whole or not at all.
func (s *Store) WriteEvents(ctx context.Context, run, name string, data []byte) error {
	if err := checkRun(run); err != nil {
		return err
	}
	if !eventFilePattern.MatchString(name) {
		return fmt.Errorf("checkpoint: event file name %q; want events.out.tfevents. and up to 150 letters, digits and ._-", name)
	}
	if len(data) > MaxEventFileBytes {
		return fmt.Errorf("checkpoint: event file %s of %d bytes; at most %d", name, len(data), MaxEventFileBytes)
	}
	return s.bucket.WriteAll(ctx, run+"/"+EventsDir+"/"+name, data, &blob.WriterOptions{ContentType: "application/octet-stream"})
}

// EventFiles lists run's event files in the order TensorBoard reads them.
func (s *Store) EventFiles(ctx context.Context, run string) ([]string, error) {
	if err := checkRun(run); err != nil {
		return nil, err
	}
	prefix := run + "/" + EventsDir + "/"
	var names []string
	it := s.bucket.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint: listing the event files of %s: %w", run, err)
		}
		if name := strings.TrimPrefix(obj.Key, prefix); eventFilePattern.MatchString(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// ReadEvents reads one event file of run, refusing one over MaxEventFileBytes.
func (s *Store) ReadEvents(ctx context.Context, run, name string) ([]byte, error) {
	if err := checkRun(run); err != nil {
		return nil, err
	}
	if !eventFilePattern.MatchString(name) {
		return nil, fmt.Errorf("checkpoint: event file name %q is not one", name)
	}
	r, err := s.bucket.NewReader(ctx, run+"/"+EventsDir+"/"+name, nil)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: reading event file %s of %s: %w", name, run, err)
	}
	defer r.Close()
	if r.Size() > MaxEventFileBytes {
		return nil, fmt.Errorf("checkpoint: event file %s of %s has %d bytes; at most %d", name, run, r.Size(), MaxEventFileBytes)
	}
	return io.ReadAll(io.LimitReader(r, MaxEventFileBytes))
}
