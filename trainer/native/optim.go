package native

import "math"

// optimizer updates params in place from grads, as torch.optim defines it.
// A step is begin, then update over ranges that cover the parameters once, in
// any order: every rule here is element-wise, so a step applied bucket by
// bucket (as the buckets' all-reduces finish) is bit-identical to one pass.
// The gradient of parameter i is grads[i]*scale, rounded to float32: the
// ranks' sum times 1/world, their mean, exactly as if grads had been scaled
// in place first, without a pass over memory to do it.
type optimizer interface {
	// begin starts a step: it counts it and fixes what depends on the count.
	begin()
	// update applies the step begun to params[lo:hi] from grads[lo:hi]*scale.
	update(params, grads []float32, scale float32, lo, hi int)
	// buffers are the optimizer's state vectors, saved with the weights.
	buffers() [][]float32
	steps() int64
	setSteps(int64)
}

func newOptimizer(c Config, n int) optimizer {
	if c.Optimizer == "sgd" {
		return &sgd{lr: float32(c.LR), momentum: float32(*c.Momentum), decay: float32(c.WeightDecay), velocity: make([]float32, n)}
	}
	return &adam{lr: c.LR, decay: float32(c.WeightDecay), beta1: 0.9, beta2: 0.999, eps: 1e-8, m: make([]float32, n), v: make([]float32, n)}
}

// sgd is torch.optim.SGD: v = momentum*v + g (v = g on the first step); p -= lr*v.
type sgd struct {
	lr, momentum, decay float32
	velocity            []float32
	t                   int64
	first               bool // the step begun is the first: the velocity starts as the gradient
}

func (o *sgd) begin() {
	o.first = o.t == 0
	o.t++
}

func (o *sgd) update(p, g []float32, scale float32, lo, hi int) {
	first := o.first
	v := o.velocity
	for i := lo; i < hi; i++ {
		gi := float32(g[i]*scale) + o.decay*p[i]
		if o.momentum != 0 {
			if first {
				v[i] = gi
			} else {
				v[i] = o.momentum*v[i] + gi
			}
			gi = v[i]
		}
		p[i] -= o.lr * gi
	}
}

func (o *sgd) buffers() [][]float32 { return [][]float32{o.velocity} }
func (o *sgd) steps() int64         { return o.t }
func (o *sgd) setSteps(t int64)     { o.t = t }

// adam is torch.optim.Adam (L2 weight decay added to the gradient, not AdamW).
type adam struct {
	lr                   float64
	decay, beta1, beta2  float32
	eps                  float64
	m, v                 []float32
	t                    int64
	stepSize, invSqrtBC2 float32 // of the step begun: lr over the first moment's bias correction, and 1/sqrt of the second's
}

func (o *adam) begin() {
	o.t++
	bc1 := 1 - math.Pow(float64(o.beta1), float64(o.t))
	bc2 := 1 - math.Pow(float64(o.beta2), float64(o.t))
	o.stepSize, o.invSqrtBC2 = float32(o.lr/bc1), float32(1/math.Sqrt(bc2))
}

func (o *adam) update(p, g []float32, scale float32, lo, hi int) {
	adamStep(p[lo:hi], g[lo:hi], o.m[lo:hi], o.v[lo:hi], scale, o.beta1, o.beta2, o.decay, o.stepSize, o.invSqrtBC2, float32(o.eps))
}

// minNormal32 is the smallest normal float32 (FLT_MIN).
const minNormal32 = 0x1p-126

// adamStepGo is the reference kernel: one pass of torch.optim.Adam's update,
// the gradient being g*scale.
func adamStepGo(p, g, m, v []float32, scale, b1, b2, decay, stepSize, invSqrtBC2, eps float32) {
	g, m, v = g[:len(p)], m[:len(p)], v[:len(p)]
	for i := range p {
		gi := float32(g[i]*scale) + decay*p[i]
		mi := b1*m[i] + (1-b1)*gi
		vi := b2*v[i] + (1-b2)*gi*gi
		// Moments of parameters that get no gradient (weights of always-blank
		// pixels) decay into subnormal floats, which x86 computes with microcode
		// assists: training slowed 2.4x by epoch 3. Below the smallest normal
		// float they contribute nothing (an update of ~1e-41), so they become 0.
		if mi < minNormal32 && mi > -minNormal32 {
			mi = 0
		}
		if vi < minNormal32 {
			vi = 0
		}
		m[i], v[i] = mi, vi
		denom := float32(math.Sqrt(float64(vi)))*invSqrtBC2 + eps
		p[i] -= stepSize * mi / denom
	}
}

func (o *adam) buffers() [][]float32 { return [][]float32{o.m, o.v} }
func (o *adam) steps() int64         { return o.t }
func (o *adam) setSteps(t int64)     { o.t = t }
