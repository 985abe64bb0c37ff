package spec

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Metric names a run reports every epoch: what checkpoint.score, a search's
// metric and its stop criteria may name.
const (
	MetricTestAccuracy = "test_accuracy"
	MetricTestLoss     = "test_loss"
	MetricTrainLoss    = "train_loss"
)

// Metrics lists the metrics every backend may report in fields of their
// own, in the order errors list them. A run may report any other metric
// as well (EpochMetrics.Other).
var Metrics = []string{MetricTestAccuracy, MetricTestLoss, MetricTrainLoss}

// MaxOtherMetrics bounds the metrics an epoch reports beyond Metrics
// (every epoch's travel through the run's history).
const MaxOtherMetrics = 64

// A metric's name may group with '/' as Lightning's and Hugging Face's do
// ("train/loss", "eval/accuracy"); TensorBoard shows such tags in groups.
var metricNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_./-]{0,63}$`)

// Modes: whether a metric is better higher or lower.
const (
	ModeMax = "max"
	ModeMin = "min"
)

// Value is the named metric of an epoch; ok is false for one the epoch
// did not report.
func (m EpochMetrics) Value(name string) (v float64, ok bool) {
	switch name {
	case MetricTestAccuracy:
		v, ok = m.TestAccuracy, true
	case MetricTestLoss:
		v, ok = m.TestLoss, true
	case MetricTrainLoss:
		v, ok = m.TrainLoss, true
	default:
		v, ok = m.Other[name]
		return v, ok
	}
	return v, !slices.Contains(m.Absent, name)
}

// Map is the epoch's metrics by name, as checkpoint manifests record them:
// those it reported.
func (m EpochMetrics) Map() map[string]float64 {
	out := make(map[string]float64, len(Metrics)+len(m.Other))
	for k, v := range m.Other {
		out[k] = v
	}
	for _, name := range Metrics {
		if v, ok := m.Value(name); ok {
			out[name] = v
		}
	}
	return out
}

// MetricsFromMap is the inverse of Map: an epoch's metrics as a checkpoint
// manifest records them.
func MetricsFromMap(epoch int, m map[string]float64) EpochMetrics {
	out := EpochMetrics{Epoch: epoch}
	fields := map[string]*float64{MetricTestAccuracy: &out.TestAccuracy, MetricTestLoss: &out.TestLoss, MetricTrainLoss: &out.TrainLoss}
	for _, name := range Metrics {
		if v, ok := m[name]; ok {
			*fields[name] = v
		} else {
			out.Absent = append(out.Absent, name)
		}
	}
	for k, v := range m {
		if _, known := fields[k]; !known {
			if out.Other == nil {
				out.Other = map[string]float64{}
			}
			out.Other[k] = v
		}
	}
	return out
}

// Names are the metrics the epoch reported, sorted.
func (m EpochMetrics) Names() []string {
	return slices.Sorted(maps.Keys(m.Map()))
}

// MissingMetric names the field when an epoch did not report the metric
// it names, listing what it did report.
func (m EpochMetrics) MissingMetric(field, name string) error {
	if _, ok := m.Value(name); ok {
		return nil
	}
	return fmt.Errorf("%s is %q, but the run's epoch %d reported only %s; want one of them (or report %q)", field, name, m.Epoch, strings.Join(m.Names(), ", "), name)
}

// CheckMetricName names the field when name cannot be a metric's.
func CheckMetricName(field, name string) error {
	if metricNamePattern.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%s is %q; want a metric's name: %s, or one your program reports (1-64 letters, digits, _, ., / or -, starting with a letter or _)", field, name, quoteList(Metrics))
}

// Better says whether a beats b under mode ("min": lower is better; anything
// else: higher is better). NaN never beats anything.
func Better(mode string, a, b float64) bool {
	if mode == ModeMin {
		return a < b
	}
	return a > b
}

// CheckMetric names the field when name cannot be a metric's (whether a
// run reports it is known at its first report: MissingMetric).
func CheckMetric(field, name string) error { return CheckMetricName(field, name) }

// CheckMode names the field when mode is neither "max" nor "min".
func CheckMode(field, mode string) error {
	if mode == ModeMax || mode == ModeMin {
		return nil
	}
	return fmt.Errorf(`%s is %q; want "max" or "min"`, field, mode)
}

func quoteList(names []string) string {
	s := ""
	for i, n := range names {
		switch {
		case i == 0:
		case i == len(names)-1:
			s += " or "
		default:
			s += ", "
		}
		s += fmt.Sprintf("%q", n)
	}
	return s
}
