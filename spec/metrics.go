package spec

import "fmt"

// Metric names a run reports every epoch: what checkpoint.score, a search's
// metric and its stop criteria may name.
const (
	MetricTestAccuracy = "test_accuracy"
	MetricTestLoss     = "test_loss"
	MetricTrainLoss    = "train_loss"
)

// Metrics lists the metric names, in the order errors list them.
var Metrics = []string{MetricTestAccuracy, MetricTestLoss, MetricTrainLoss}

// Modes: whether a metric is better higher or lower.
const (
	ModeMax = "max"
	ModeMin = "min"
)

// Value is the named metric of an epoch; ok is false for a name not in Metrics.
func (m EpochMetrics) Value(name string) (v float64, ok bool) {
	switch name {
	case MetricTestAccuracy:
		return m.TestAccuracy, true
	case MetricTestLoss:
		return m.TestLoss, true
	case MetricTrainLoss:
		return m.TrainLoss, true
	}
	return 0, false
}

// Map is the epoch's metrics by name, as checkpoint manifests record them.
func (m EpochMetrics) Map() map[string]float64 {
	out := make(map[string]float64, len(Metrics))
	for _, name := range Metrics {
		out[name], _ = m.Value(name)
	}
	return out
}

// Better says whether a beats b under mode ("min": lower is better; anything
// else: higher is better). NaN never beats anything.
func Better(mode string, a, b float64) bool {
	if mode == ModeMin {
		return a < b
	}
	return a > b
}

// CheckMetric names the field when name is not a metric.
func CheckMetric(field, name string) error {
	if _, ok := (EpochMetrics{}).Value(name); ok {
		return nil
	}
	return fmt.Errorf("%s is %q; want %s", field, name, quoteList(Metrics))
}

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
