package spec

import "time"

// WithDefaults fills what was left out.
func (t Training) WithDefaults() Training {
	if t.Trainer == "" {
		t.Trainer = TrainerNative
	}
	if t.Trainer == TrainerNative {
		t.applyNativeConfig()
	}
	if t.MLflow != nil && t.MLflow.ExperimentName == "" {
		m := *t.MLflow // the caller's section stays as it was
		m.ExperimentName = DefaultExperiment
		t.MLflow = &m
	}
	if t.Model.Hidden == nil {
		t.Model.Hidden = []int{256, 128}
	}
	if t.Dataset.URL == "" {
		t.Dataset.URL = DefaultDatasetURL
	}
	if t.Dataset.Format == "" {
		t.Dataset.Format = DefaultDatasetFormat
	}
	h := &t.Hyper
	if h.Epochs == 0 {
		h.Epochs = 10
	}
	if h.BatchSize == 0 {
		h.BatchSize = 128
	}
	if h.Optimizer == "" {
		h.Optimizer = "adam"
	}
	if h.LR == 0 {
		h.LR = map[string]float64{"adam": 1e-3, "sgd": 0.01}[h.Optimizer]
	}
	h.Momentum = Float64(h.MomentumOf())
	s := &t.Scaling
	if s.Workers == 0 {
		s.Workers = 1
	}
	if s.MinWorkers == 0 {
		s.MinWorkers = s.Workers
	}
	if s.GPUsPerWorker == 0 {
		s.GPUsPerWorker = 1
	}
	if s.WorkersPerHost == 0 {
		s.WorkersPerHost = 1
	}
	if s.AllReduce == "" {
		s.AllReduce = AllReduceHierarchical
	}
	if s.BucketBytes == 0 {
		s.BucketBytes = DefaultBucketBytes
	}
	if s.TaskQueue == "" {
		s.TaskQueue = DefaultTaskQueue
	}
	if s.GangTimeout == 0 {
		s.GangTimeout = Duration(2 * time.Minute)
	}
	c := &t.Checkpoint
	if c.URL == "" {
		c.URL = DefaultCheckpointURL
	}
	if c.EveryEpochs == 0 {
		c.EveryEpochs = 1
	}
	c.KeepLast = Int(c.KeepLastN())
	if c.Score == "" {
		c.Score = MetricTestAccuracy
	}
	if c.Mode == "" {
		c.Mode = ModeMax
	}
	f := &t.Failure
	f.MaxFailures, f.MaxPreemptions = Int(f.FailureBudget()), Int(f.PreemptionBudget())
	if f.HeartbeatTimeout == 0 {
		f.HeartbeatTimeout = Duration(10 * time.Second)
	}
	if f.StallTimeout == 0 {
		f.StallTimeout = Duration(f.RingStallTimeout())
	}
	return t
}

// KeepLastN is checkpoint.keep_last, its default if left out (0: every one).
func (c Checkpoint) KeepLastN() int { return deref(c.KeepLast, 2) }

// FailureBudget and PreemptionBudget are failure.max_failures and
// failure.max_preemptions, their defaults if left out.
func (f Failure) FailureBudget() int { return deref(f.MaxFailures, 3) }

func (f Failure) PreemptionBudget() int { return deref(f.MaxPreemptions, 20) }

// MomentumOf is hyper.momentum, its default for the optimizer if left out.
func (h Hyper) MomentumOf() float64 {
	return deref(h.Momentum, map[string]float64{"sgd": 0.9}[h.Optimizer])
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
