package native

import (
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// mlp is the network: layer l maps sizes[l] inputs to sizes[l+1] outputs.
// All weights and biases live in one flat slice (and the gradients in
// another), so a step all-reduces one buffer.
type mlp struct {
	sizes   []int
	params  []float32
	grads   []float32 // len(params)+2: the two last slots carry the leave votes and the batch loss through the all-reduce
	w, b    [][]float32
	gw, gb  [][]float32
	woff    []int       // where layer l's weights start in params (and its weight gradient in grads)
	acts    [][]float32 // acts[0] is the input batch; acts[l] the output of layer l
	deltas  [][]float32 // gradient of the loss with respect to layer l's pre-activation
	batched int         // rows the buffers hold
}

func newMLP(sizes []int) *mlp {
	m := &mlp{sizes: sizes}
	n := 0
	for l := range len(sizes) - 1 {
		n += sizes[l]*sizes[l+1] + sizes[l+1]
	}
	m.params = make([]float32, n)
	m.grads = make([]float32, n+2)
	off := 0
	for l := range len(sizes) - 1 {
		in, out := sizes[l], sizes[l+1]
		m.woff = append(m.woff, off)
		m.w = append(m.w, m.params[off:off+in*out])
		m.gw = append(m.gw, m.grads[off:off+in*out])
		off += in * out
		m.b = append(m.b, m.params[off:off+out])
		m.gb = append(m.gb, m.grads[off:off+out])
		off += out
	}
	return m
}

func (m *mlp) layers() int { return len(m.sizes) - 1 }

// init draws weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), torch.nn.Linear's default.
func (m *mlp) init(rng *rand.Rand) {
	for l := range m.layers() {
		bound := 1 / math.Sqrt(float64(m.sizes[l]))
		for i := range m.w[l] {
			m.w[l][i] = float32((2*rng.Float64() - 1) * bound)
		}
		for i := range m.b[l] {
			m.b[l][i] = float32((2*rng.Float64() - 1) * bound)
		}
	}
}

// reserve sizes the activation buffers for batches of up to rows examples.
func (m *mlp) reserve(rows int) {
	if rows <= m.batched {
		return
	}
	m.acts = make([][]float32, len(m.sizes))
	m.deltas = make([][]float32, len(m.sizes))
	for l, s := range m.sizes {
		m.acts[l] = make([]float32, rows*s)
		m.deltas[l] = make([]float32, rows*s)
	}
	m.batched = rows
}

// forward computes the logits of rows examples of x (rows × sizes[0]) into acts.
func (m *mlp) forward(x []float32, rows int) []float32 {
	m.reserve(rows)
	copy(m.acts[0], x[:rows*m.sizes[0]])
	impl := blas32.Implementation()
	for l := range m.layers() {
		in, out := m.sizes[l], m.sizes[l+1]
		a, z := m.acts[l][:rows*in], m.acts[l+1][:rows*out]
		for r := range rows {
			copy(z[r*out:(r+1)*out], m.b[l])
		}
		impl.Sgemm(blas.NoTrans, blas.NoTrans, rows, out, in, 1, a, in, m.w[l], out, 1, z, out)
		if l < m.layers()-1 {
			for i, v := range z {
				if v < 0 {
					z[i] = 0
				}
			}
		}
	}
	return m.acts[m.layers()][:rows*m.sizes[m.layers()]]
}

// lossAndDelta returns the summed softmax cross-entropy of the logits against
// labels, the number predicted right, and (if delta != nil) writes the
// gradient of the mean loss with respect to the logits into it.
func lossAndDelta(logits []float32, labels []uint8, classes int, delta []float32) (loss float64, correct int) {
	rows := len(labels)
	inv := 1 / float32(rows)
	for r := range rows {
		z := logits[r*classes : (r+1)*classes]
		best := 0
		for j, v := range z {
			if v > z[best] {
				best = j
			}
		}
		if best == int(labels[r]) {
			correct++
		}
		peak := float64(z[best])
		var sum float64
		for _, v := range z {
			sum += math.Exp(float64(v) - peak)
		}
		logSum := math.Log(sum)
		loss += logSum + peak - float64(z[labels[r]])
		if delta != nil {
			d := delta[r*classes : (r+1)*classes]
			for j, v := range z {
				d[j] = float32(math.Exp(float64(v)-peak-logSum)) * inv
			}
			d[labels[r]] -= inv
		}
	}
	return loss, correct
}

// backward fills grads from the deltas of the last layer (already in
// deltas[L]), from the last layer to the first. With ready set, it computes a
// weight gradient blockRows input rows at a time, from the last row up, and
// calls ready(lo) each time grads[lo:] (the two vote slots included) is
// complete, so the gradient can be all-reduced while the rest is computed.
// A block is as many whole rows as fit in blockFloats (at least one). The
// blocks are the same on every rank and in every run, so the sums are too.
func (m *mlp) backward(rows int, blockFloats int, ready func(lo int)) {
	impl := blas32.Implementation()
	for l := m.layers() - 1; l >= 0; l-- {
		in, out := m.sizes[l], m.sizes[l+1]
		a, d := m.acts[l][:rows*in], m.deltas[l+1][:rows*out]
		gb := m.gb[l]
		clear(gb)
		for r := range rows {
			row := d[r*out : (r+1)*out]
			for j, v := range row {
				gb[j] += v
			}
		}
		if ready == nil {
			impl.Sgemm(blas.Trans, blas.NoTrans, in, out, rows, 1, a, in, d, out, 0, m.gw[l], out)
		} else {
			ready(m.woff[l] + in*out)
			block := max(1, blockFloats/out)
			for hi := in; hi > 0; hi -= block {
				lo := max(0, hi-block)
				// Rows lo..hi of gw = columns lo..hi of a, transposed, times d.
				impl.Sgemm(blas.Trans, blas.NoTrans, hi-lo, out, rows, 1, a[lo:], in, d, out, 0, m.gw[l][lo*out:hi*out], out)
				ready(m.woff[l] + lo*out)
			}
		}
		if l == 0 {
			break
		}
		prev := m.deltas[l][:rows*in]
		impl.Sgemm(blas.NoTrans, blas.Trans, rows, in, out, 1, d, out, m.w[l], out, 0, prev, in)
		for i, v := range a {
			if v <= 0 { // ReLU: no gradient where the unit was off
				prev[i] = 0
			}
		}
	}
}
