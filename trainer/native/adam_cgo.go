//go:build openblas

package native

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -lm
#include <float.h>
#include <math.h>
#include <immintrin.h>

// One pass of torch.optim.Adam over n parameters, exactly as adamStepGo
// computes it (same operations in the same order, correctly rounded, no FMA),
// eight at a time with AVX2 where the CPU has it.
static inline void dt_adam_scalar(float *p, const float *g, float *m, float *v, long i, long n, float scale,
                                  float b1, float b2, float decay, float step_size, float inv_sqrt_bc2, float eps) {
	for (; i < n; i++) {
		float gs = g[i] * scale;
		float gi = gs + decay * p[i];
		float mi = b1 * m[i] + (1 - b1) * gi;
		float vi = b2 * v[i] + (1 - b2) * gi * gi;
		if (fabsf(mi) < FLT_MIN) mi = 0; // subnormals: see adamStepGo
		if (vi < FLT_MIN) vi = 0;
		m[i] = mi;
		v[i] = vi;
		float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
		p[i] -= step_size * mi / denom;
	}
}

__attribute__((target("avx2")))
static void dt_adam_avx2(float *p, const float *g, float *m, float *v, long n, float scale,
                         float b1, float b2, float decay, float step_size, float inv_sqrt_bc2, float eps) {
	__m256 G = _mm256_set1_ps(scale);
	__m256 B1 = _mm256_set1_ps(b1), B2 = _mm256_set1_ps(b2), C1 = _mm256_set1_ps(1 - b1), C2 = _mm256_set1_ps(1 - b2);
	__m256 D = _mm256_set1_ps(decay), S = _mm256_set1_ps(step_size), I = _mm256_set1_ps(inv_sqrt_bc2), E = _mm256_set1_ps(eps);
	__m256 TINY = _mm256_set1_ps(FLT_MIN), ABS = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 pi = _mm256_loadu_ps(p + i);
		__m256 gi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), G), _mm256_mul_ps(D, pi));
		__m256 mi = _mm256_add_ps(_mm256_mul_ps(B1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(C1, gi));
		__m256 vi = _mm256_add_ps(_mm256_mul_ps(B2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(C2, gi), gi));
		mi = _mm256_and_ps(mi, _mm256_cmp_ps(_mm256_and_ps(mi, ABS), TINY, _CMP_GE_OQ));
		vi = _mm256_and_ps(vi, _mm256_cmp_ps(vi, TINY, _CMP_GE_OQ));
		_mm256_storeu_ps(m + i, mi);
		_mm256_storeu_ps(v + i, vi);
		__m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), I), E);
		_mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(S, mi), denom)));
	}
	dt_adam_scalar(p, g, m, v, i, n, scale, b1, b2, decay, step_size, inv_sqrt_bc2, eps);
}

static void dt_adam_step(float *p, const float *g, float *m, float *v, long n, float scale,
                         float b1, float b2, float decay, float step_size, float inv_sqrt_bc2, float eps) {
	if (__builtin_cpu_supports("avx2")) {
		dt_adam_avx2(p, g, m, v, n, scale, b1, b2, decay, step_size, inv_sqrt_bc2, eps);
	} else {
		dt_adam_scalar(p, g, m, v, 0, n, scale, b1, b2, decay, step_size, inv_sqrt_bc2, eps);
	}
}
*/
import "C"

// adamStep is the AVX2 C kernel in the cgo build, bit-identical to adamStepGo.
func adamStep(p, g, m, v []float32, scale, b1, b2, decay, stepSize, invSqrtBC2, eps float32) {
	if len(p) == 0 {
		return
	}
	C.dt_adam_step((*C.float)(&p[0]), (*C.float)(&g[0]), (*C.float)(&m[0]), (*C.float)(&v[0]), C.long(len(p)), C.float(scale),
		C.float(b1), C.float(b2), C.float(decay), C.float(stepSize), C.float(invSqrtBC2), C.float(eps))
}
