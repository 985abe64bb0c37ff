package activities

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"strconv"

	"gocloud.dev/blob"

	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
)

// Results writes searches' results on the workflows' queue, where the
// worker's policy allows (results_url falls under its storage roots).
type Results struct{ Policy policy.Policy }

// WriteTuneResults writes a search's results table as CSV to
// <url>/<name>/results.csv and returns where: one row per trial with its
// config (one column per searched path), status, epochs, last and best
// metric, and checkpoint.
func (r Results) WriteTuneResults(ctx context.Context, in spec.WriteTuneResultsInput) (string, error) {
	url, err := r.Policy.Resolve("results_url", in.URL)
	if err != nil {
		return "", userError(err)
	}
	if err := spec.CheckName("name", in.Name); err != nil {
		return "", userError(err)
	}
	b, err := blob.OpenBucket(ctx, url)
	if err != nil {
		return "", fmt.Errorf("opening %s for the results: %w", in.URL, err)
	}
	defer b.Close()
	key := in.Name + "/results.csv"
	w, err := b.NewWriter(ctx, key, &blob.WriterOptions{ContentType: "text/csv"})
	if err != nil {
		return "", err
	}
	if err := writeCSV(w, in.Results); err != nil {
		w.Close()
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	return key + " in " + in.URL, nil
}

func writeCSV(w interface{ Write([]byte) (int, error) }, r *spec.TuneResults) error {
	paths := r.ConfigPaths()
	c := csv.NewWriter(w)
	head := append([]string{"trial", "workflow_id"}, paths...)
	head = append(head, "status", "epochs", "last_"+r.Metric, "best_"+r.Metric, "checkpoint", "reason")
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
		row = append(row, t.Status, strconv.Itoa(t.Epochs), num(t.Last), num(t.Best), ckpt, t.Reason)
		c.Write(row)
	}
	c.Flush()
	return c.Error()
}
