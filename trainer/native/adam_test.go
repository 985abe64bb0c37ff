package native

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAdamKernelMatchesTheReference: the kernel this build uses (AVX2 C in
// the cgo build, Go otherwise) is bit-identical to the Go reference.
func TestAdamKernelMatchesTheReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 1003
	vec := func(scale float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return v
	}
	p, g, m, v := vec(1), vec(0.1), vec(0.01), vec(0.001)
	for i := range v {
		v[i] = float32(math.Abs(float64(v[i])))
	}
	// Some moments on the edge of the subnormal range, as blank pixels' weights reach it.
	for i := 0; i < n; i += 10 {
		g[i], m[i], v[i] = 0, 1.5e-38, 1.18e-38
	}
	p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
	for step := range 5 {
		scale := []float32{1, 0.5, 1 / float32(3), 0.25, 1 / float32(7)}[step]
		adamStep(p, g, m, v, scale, 0.9, 0.999, 1e-4, 1e-3/0.1, 1/float32(math.Sqrt(0.001)), 1e-8)
		adamStepGo(p2, g, m2, v2, scale, 0.9, 0.999, 1e-4, 1e-3/0.1, 1/float32(math.Sqrt(0.001)), 1e-8)
	}
	for i := range p {
		if m[i] != 0 && math.Abs(float64(m[i])) < minNormal32 || v[i] != 0 && v[i] < minNormal32 {
			t.Fatalf("element %d: a subnormal moment survived (m=%v v=%v)", i, m[i], v[i])
		}
		if math.Float32bits(p[i]) != math.Float32bits(p2[i]) || m[i] != m2[i] || v[i] != v2[i] {
			t.Fatalf("element %d: kernel p=%v m=%v v=%v, reference p=%v m=%v v=%v", i, p[i], m[i], v[i], p2[i], m2[i], v2[i])
		}
	}
}

// Scaling the gradient inside the step is bit for bit scaling it in place
// first, as the buckets did before the step took a scale: weights trained
// before and after the change are the same.
func TestAdamStepScalesAsScalingInPlaceFirst(t *testing.T) {
	const n = 1003
	vec := func(seed float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = seed * float32(math.Sin(float64(i)*0.37+float64(seed)))
		}
		return v
	}
	for _, world := range []int{2, 3, 4, 6, 8} {
		scale := 1 / float32(world)
		p, g, m, v := vec(1), vec(3), vec(0.01), vec(0.001)
		for i := range v {
			v[i] = float32(math.Abs(float64(v[i])))
		}
		p2, m2, v2 := slices.Clone(p), slices.Clone(m), slices.Clone(v)
		scaled := slices.Clone(g)
		for i := range scaled {
			scaled[i] *= scale
		}
		adamStep(p, g, m, v, scale, 0.9, 0.999, 1e-4, 1e-3, 1, 1e-8)
		adamStep(p2, scaled, m2, v2, 1, 0.9, 0.999, 1e-4, 1e-3, 1, 1e-8)
		for i := range p {
			if math.Float32bits(p[i]) != math.Float32bits(p2[i]) || m[i] != m2[i] || v[i] != v2[i] {
				t.Fatalf("world %d, element %d: scaled in the step p=%v, scaled first p=%v", world, i, p[i], p2[i])
			}
		}
		sgd1 := &sgd{lr: 0.1, momentum: 0.9, decay: 1e-4, velocity: make([]float32, n)}
		sgd2 := &sgd{lr: 0.1, momentum: 0.9, decay: 1e-4, velocity: make([]float32, n)}
		q, q2 := vec(1), vec(1)
		for range 2 {
			sgd1.begin()
			sgd2.begin()
			sgd1.update(q, g, scale, 0, n)
			sgd2.update(q2, scaled, 1, 0, n)
		}
		for i := range q {
			if math.Float32bits(q[i]) != math.Float32bits(q2[i]) {
				t.Fatalf("sgd, world %d, element %d: scaled in the step %v, scaled first %v", world, i, q[i], q2[i])
			}
		}
	}
}

func benchAdam(b *testing.B, kernel func(p, g, m, v []float32, scale, b1, b2, decay, stepSize, invSqrtBC2, eps float32)) {
	const n = 235146 // the default MLP
	p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(i%7) * 0.01
	}
	b.SetBytes(4 * 4 * n)
	for b.Loop() {
		kernel(p, g, m, v, 0.5, 0.9, 0.999, 0, 1e-3, 1, 1e-8)
	}
}

// BenchmarkAdamStep is this build's kernel; BenchmarkAdamStepGo the Go reference.
func BenchmarkAdamStep(b *testing.B)   { benchAdam(b, adamStep) }
func BenchmarkAdamStepGo(b *testing.B) { benchAdam(b, adamStepGo) }
