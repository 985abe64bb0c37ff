//go:build !openblas

package native

// adamStep is the pure-Go kernel outside the cgo build.
func adamStep(p, g, m, v []float32, scale, b1, b2, decay, stepSize, invSqrtBC2, eps float32) {
	adamStepGo(p, g, m, v, scale, b1, b2, decay, stepSize, invSqrtBC2, eps)
}
