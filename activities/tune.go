package activities

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"go.temporal.io/sdk/activity"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"gocloud.dev/blob"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
)

// Results writes searches' results on the workflows' queue, where the
// worker's policy allows (results_url falls under its storage roots).
type Results struct {
	Policy policy.Policy
	// PoolKey, if set, is the pool's key: CloneCheckpoint clones only
	// checkpoints signed with it, and signs its clones.
	PoolKey []byte
	Log     *zap.Logger
}

// WriteTuneResults writes a search's results table as CSV to
// <url>/<name>/results.csv and returns where: one row per trial with its
// config (one column per searched path), status, epochs, last and best
// metric, and checkpoint. The rows a big search moved out of its state
// (WriteTuneRows) are read back from their parts and merged in, by trial.
func (r Results) WriteTuneResults(ctx context.Context, in spec.WriteTuneResultsInput) (string, error) {
	b, err := r.open(ctx, in.URL, in.Name)
	if err != nil {
		return "", err
	}
	defer b.Close()
	res := *in.Results
	if len(res.Parts) > 0 {
		rows, err := readParts(ctx, b, in.Name, res.Parts)
		if err != nil {
			return "", err
		}
		res.Trials = append(rows, res.Trials...)
		slices.SortStableFunc(res.Trials, func(a, b spec.TrialStatus) int { return a.Trial - b.Trial })
	}
	key := in.Name + "/results.csv"
	w, err := b.NewWriter(ctx, key, &blob.WriterOptions{ContentType: "text/csv"})
	if err != nil {
		return "", err
	}
	if err := writeCSV(w, &res); err != nil {
		w.Close()
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	return key + " in " + in.URL, nil
}

// WriteTuneRows writes a part of a big search's finished rows to
// <url>/<name>/trials/part-NNNNN.jsonl, one JSON row a line, and returns
// the part's key: the search then forgets the rows, and WriteTuneResults
// reads them back for the CSV. Writing a part again replaces it.
func (r Results) WriteTuneRows(ctx context.Context, in spec.WriteTuneRowsInput) (string, error) {
	if in.Part < 0 {
		return "", userError(fmt.Errorf("part %d: want 0 or more", in.Part))
	}
	b, err := r.open(ctx, in.URL, in.Name)
	if err != nil {
		return "", err
	}
	defer b.Close()
	key := fmt.Sprintf("%s/trials/part-%05d.jsonl", in.Name, in.Part)
	w, err := b.NewWriter(ctx, key, &blob.WriterOptions{ContentType: "application/jsonl"})
	if err != nil {
		return "", err
	}
	enc := json.NewEncoder(w)
	for _, row := range in.Rows {
		if err := enc.Encode(row); err != nil {
			w.Close()
			return "", err
		}
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	return key, nil
}

// open opens the bucket of a search's results, where the policy allows.
func (r Results) open(ctx context.Context, url, name string) (*blobwatch.Bucket, error) {
	resolved, err := r.Policy.Resolve("results_url", url)
	if err != nil {
		return nil, userError(err)
	}
	if err := spec.CheckName("name", name); err != nil {
		return nil, userError(err)
	}
	b, err := blobwatch.Open(r.Policy.StorageContext(ctx), resolved)
	if err != nil {
		return nil, fmt.Errorf("opening %s for the results: %w", url, err)
	}
	return b, nil
}

// maxPartBytes bounds a part read back (a part holds at most a few
// thousand rows of a few hundred bytes).
const maxPartBytes = 256 << 20

// readParts reads the rows of a search's parts; a part must be the
// search's own (under <name>/trials/).
func readParts(ctx context.Context, b *blobwatch.Bucket, name string, parts []string) ([]spec.TrialStatus, error) {
	var rows []spec.TrialStatus
	for _, key := range parts {
		if !strings.HasPrefix(key, name+"/trials/part-") || strings.Contains(key, "..") {
			return nil, userError(fmt.Errorf("results part %q: not one of search %s's parts (%s/trials/part-NNNNN.jsonl)", key, name, name))
		}
		rd, err := b.NewReader(ctx, key, nil)
		if err != nil {
			return nil, fmt.Errorf("reading results part %s: %w", key, err)
		}
		dec := json.NewDecoder(io.LimitReader(rd, maxPartBytes))
		for {
			var row spec.TrialStatus
			if err := dec.Decode(&row); err == io.EOF {
				break
			} else if err != nil {
				rd.Close()
				return nil, fmt.Errorf("results part %s: %w", key, err)
			}
			rows = append(rows, row)
		}
		rd.Close()
	}
	return rows, nil
}

func writeCSV(w interface{ Write([]byte) (int, error) }, r *spec.TuneResults) error {
	paths := r.ConfigPaths()
	c := csv.NewWriter(w)
	head := append([]string{"trial", "workflow_id"}, paths...)
	head = append(head, "status", "epochs", "last_"+r.Metric, "best_"+r.Metric)
	scored := r.Scope != "" && r.Scope != spec.ScopeLast // the rank's own column, as "avg_test_accuracy"
	if scored {
		head = append(head, r.Scope+"_"+r.Metric)
	}
	head = append(head, "checkpoint", "reason")
	lineage := r.Scheduler == "pbt" // each exploit: "epoch 4: trial 6 (run/ckpt) hyper.lr=0.012"
	if lineage {
		head = append(head, "segments", "lineage")
	}
	// Every metric the trials last reported, a column each ("metric.f1").
	names := map[string]bool{}
	for _, t := range r.Trials {
		for k := range t.Metrics {
			names[k] = true
		}
	}
	metricCols := slices.Sorted(maps.Keys(names))
	for _, k := range metricCols {
		head = append(head, "metric."+k)
	}
	c.Write(head)
	num := func(v *float64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'g', 6, 64)
	}
	for _, t := range r.Trials {
		row := []string{strconv.Itoa(t.Trial), t.WorkflowID}
		for _, p := range paths {
			var v any
			json.Unmarshal(t.Config[p], &v)
			b, _ := json.Marshal(v)
			row = append(row, string(b))
		}
		ckpt := ""
		if t.Checkpoint != nil {
			ckpt = t.Checkpoint.Run + "/" + t.Checkpoint.ID
		}
		row = append(row, t.Status, strconv.Itoa(t.Epochs), num(t.Last), num(t.Best))
		if scored {
			row = append(row, num(t.Score))
		}
		row = append(row, ckpt, t.Reason)
		if lineage {
			row = append(row, strconv.Itoa(t.Segment), lineageText(t.Lineage))
		}
		for _, k := range metricCols {
			if v, ok := t.Metrics[k]; ok {
				row = append(row, strconv.FormatFloat(v, 'g', 6, 64))
			} else {
				row = append(row, "")
			}
		}
		c.Write(row)
	}
	c.Flush()
	return c.Error()
}

// lineageText writes a trial's exploits for a CSV cell, oldest first.
func lineageText(steps []spec.Exploit) string {
	var parts []string
	for _, e := range steps {
		p := fmt.Sprintf("epoch %d: trial %d", e.Epoch, e.From)
		if e.Cloned != "" {
			p += " (" + e.Cloned + ")"
		}
		for _, k := range slices.Sorted(maps.Keys(e.Changed)) {
			p += " " + k + "=" + string(e.Changed[k])
		}
		if e.Reason != "" {
			p += " [" + e.Reason + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// CloneCheckpoint copies a trial's checkpoint into a run of another trial's
// (PBT's exploit), verified as it is copied and committed only whole (see
// checkpoint.Store.Clone). The reported checkpoint is cloned if it still
// verifies, else the newest verified one of its run (a donor that trained
// on may have pruned it) of an epoch below in.Before, so that the trial
// has epochs left to train. Both URLs must fall under the worker's storage
// roots; with a pool key, the source must be signed by the pool and the
// clone is signed too, so a clone never launders a forged checkpoint.
func (r Results) CloneCheckpoint(ctx context.Context, in spec.CloneCheckpointInput) (*spec.CloneCheckpointResult, error) {
	if activity.IsActivity(ctx) { // a worker that dies mid-copy is noticed within the heartbeat timeout
		beat := startHeartbeat(ctx, nil)
		defer beat.stop()
	}
	fromURL, err := r.Policy.Resolve("checkpoint.url", in.From.URL)
	if err != nil {
		return nil, userError(err)
	}
	toURL, err := r.Policy.Resolve("checkpoint.url", in.URL)
	if err != nil {
		return nil, userError(err)
	}
	if err := spec.CheckName("run", in.Run); err != nil {
		return nil, userError(err)
	}
	src, err := checkpoint.Open(r.Policy.StorageContext(ctx), fromURL, r.Log)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	dst, err := checkpoint.Open(r.Policy.StorageContext(ctx), toURL, r.Log)
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	if r.PoolKey != nil {
		src.Sign(r.PoolKey)
		dst.Sign(r.PoolKey)
	}
	from, err := src.Get(ctx, checkpoint.Ref{Run: in.From.Run, ID: in.From.ID})
	if err != nil {
		latest, lerr := src.LatestVerifiedBefore(ctx, in.From.Run, in.Before)
		if lerr != nil {
			return nil, fmt.Errorf("cloning trial checkpoint %s/%s: %w; and its run has no other verified checkpoint to clone: %v", in.From.Run, in.From.ID, err, lerr)
		}
		from = latest
	}
	m, err := dst.Clone(ctx, from, in.Run)
	if err != nil {
		return nil, err
	}
	return &spec.CloneCheckpointResult{
		Source: spec.CheckpointRef{URL: in.From.URL, Run: from.Manifest.Run, ID: from.Manifest.ID, Epoch: from.Manifest.Epoch, Step: from.Manifest.Step},
		Clone:  spec.CheckpointRef{URL: in.URL, Run: m.Run, ID: m.ID, Epoch: m.Epoch, Step: m.Step},
	}, nil
}
