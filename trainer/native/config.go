package native

import (
	"fmt"
	"strings"
)

// Config is the model and its hyperparameters. Zero fields take defaults.
type Config struct {
	Hidden      []int    `json:"hidden,omitempty"`       // hidden layer widths; default [256, 128]
	Optimizer   string   `json:"optimizer,omitempty"`    // "adam" (default) or "sgd"
	LR          float64  `json:"lr,omitempty"`           // default 1e-3 for adam, 0.01 for sgd
	Momentum    *float64 `json:"momentum,omitempty"`     // sgd only; default 0.9; 0: plain SGD
	WeightDecay float64  `json:"weight_decay,omitempty"` // L2 penalty added to gradients; default 0
	BatchSize   int      `json:"batch_size,omitempty"`   // examples per rank per step; default 128
	Seed        uint64   `json:"seed,omitempty"`         // weights and shuffle order; default 0
	// BucketBytes is how much gradient a rank hands to the all-reduce at
	// once while backward computes the rest (scaling.bucket_bytes); at least
	// the gradient's size: one all-reduce after backward. Default DefaultBucketBytes.
	BucketBytes int `json:"bucket_bytes,omitempty"`
}

// WithDefaults fills the fields left out.
func (c Config) WithDefaults() Config {
	if c.Hidden == nil {
		c.Hidden = []int{256, 128}
	}
	if c.Optimizer == "" {
		c.Optimizer = "adam"
	}
	c.Optimizer = strings.ToLower(c.Optimizer)
	if c.LR == 0 {
		c.LR = map[string]float64{"adam": 1e-3, "sgd": 0.01}[c.Optimizer]
	}
	if c.Momentum == nil {
		m := map[string]float64{"sgd": 0.9}[c.Optimizer]
		c.Momentum = &m
	}
	if c.BatchSize == 0 {
		c.BatchSize = 128
	}
	if c.BucketBytes == 0 {
		c.BucketBytes = DefaultBucketBytes
	}
	return c
}

// Validate names the first field that is out of range, with what is accepted.
func (c Config) Validate() error {
	for i, h := range c.Hidden {
		if h < 1 || h > 1<<16 {
			return fmt.Errorf("model.hidden[%d] is %d; want a width from 1 to 65536", i, h)
		}
	}
	switch {
	case c.Optimizer != "adam" && c.Optimizer != "sgd":
		return fmt.Errorf("hyper.optimizer is %q; want \"adam\" or \"sgd\"", c.Optimizer)
	case !(c.LR > 0 && c.LR < 10):
		return fmt.Errorf("hyper.lr is %v; want a number in (0, 10)", c.LR)
	case c.Momentum != nil && !(*c.Momentum >= 0 && *c.Momentum < 1):
		return fmt.Errorf("hyper.momentum is %v; want a number in [0, 1)", *c.Momentum)
	case c.WeightDecay < 0 || c.WeightDecay >= 1:
		return fmt.Errorf("hyper.weight_decay is %v; want a number in [0, 1)", c.WeightDecay)
	case c.BatchSize < 1 || c.BatchSize > 1<<16:
		return fmt.Errorf("hyper.batch_size is %d; want 1 to 65536 examples per rank", c.BatchSize)
	case c.BucketBytes < MinBucketBytes || c.BucketBytes > MaxBucketBytes:
		return fmt.Errorf("scaling.bucket_bytes is %d; want %d (4 KiB) to %d (1 GiB)", c.BucketBytes, MinBucketBytes, MaxBucketBytes)
	}
	return nil
}
