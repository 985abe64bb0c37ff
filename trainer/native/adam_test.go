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
	for range 5 {
		adamStep(p, g, m, v, 0.9, 0.999, 1e-4, 1e-3/0.1, 1/float32(math.Sqrt(0.001)), 1e-8)
		adamStepGo(p2, g, m2, v2, 0.9, 0.999, 1e-4, 1e-3/0.1, 1/float32(math.Sqrt(0.001)), 1e-8)
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

func benchAdam(b *testing.B, kernel func(p, g, m, v []float32, b1, b2, decay, stepSize, invSqrtBC2, eps float32)) {
	const n = 235146 // the default MLP
	p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		g[i] = float32(i%7) * 0.01
	}
	b.SetBytes(4 * 4 * n)
	for b.Loop() {
		kernel(p, g, m, v, 0.9, 0.999, 0, 1e-3, 1, 1e-8)
	}
}

// BenchmarkAdamStep is this build's kernel; BenchmarkAdamStepGo the Go reference.
func BenchmarkAdamStep(b *testing.B)   { benchAdam(b, adamStep) }
func BenchmarkAdamStepGo(b *testing.B) { benchAdam(b, adamStepGo) }
