package tune

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/durabletrain/durabletrain/spec"
)

// TPE is the Tree-structured Parzen Estimator (Bergstra et al., 2011) as
// Optuna's default sampler builds it: until NStartupTrials trials have
// ended it draws at random (the random searcher's draws, trial by trial);
// then it splits the ended trials into the best γ(n) = min(⌈n/10⌉, 25)
// ("good") and the rest, models each dimension separately as a Parzen
// window over each group's values (truncated Gaussians around each value
// with widths from its neighbours' distances, clipped as Optuna's "magic
// clip", plus a prior over the whole range; categorical counts plus a
// uniform prior for choice), draws NEICandidates values from the good
// model and keeps the one that most raises l(x)/g(x), the ratio that
// maximises expected improvement. Older trials weigh less once there are
// more than 25 in a group (Optuna's default_weights). Every draw comes from
// a generator seeded by the search's seed and the trial's number, so the
// same observations give the same suggestion.
type TPE struct {
	space      map[string]Domain
	keys       []string
	mode       string
	seed       uint64
	startup    int
	candidates int
	obs        []observation
}

type observation struct {
	Trial  int                        `json:"trial"`
	Config map[string]json.RawMessage `json:"config"`
	Score  float64                    `json:"score"`
}

// priorWeight is the prior's weight beside each observation's (Optuna's 1.0).
const priorWeight = 1.0

func (t *TPE) Observe(trial int, config map[string]json.RawMessage, score float64) {
	if !finite(score) {
		return
	}
	t.obs = append(t.obs, observation{Trial: trial, Config: config, Score: score})
	if len(t.obs) > MaxObservations {
		t.obs = slices.Delete(t.obs, 0, len(t.obs)-MaxObservations)
	}
}

func (t *TPE) Suggest(trial int) map[string]json.RawMessage {
	if len(t.obs) < t.startup {
		return randomConfig(t.space, t.keys, t.seed, trial)
	}
	good, bad := t.split()
	rng := rand.New(rand.NewPCG(t.seed, uint64(trial)))
	cfg := make(map[string]json.RawMessage, len(t.keys))
	for _, k := range t.keys {
		cfg[k] = t.suggestDim(rng, k, good, bad)
	}
	return cfg
}

// split orders the observations best first (ties: the earlier trial) and
// cuts off the best γ(n); each group keeps trial order for its weights.
func (t *TPE) split() (good, bad []observation) {
	sorted := slices.Clone(t.obs)
	slices.SortStableFunc(sorted, func(a, b observation) int {
		switch {
		case spec.Better(t.mode, a.Score, b.Score):
			return -1
		case spec.Better(t.mode, b.Score, a.Score):
			return 1
		}
		return a.Trial - b.Trial
	})
	n := min(int(math.Ceil(0.1*float64(len(sorted)))), 25)
	n = max(n, 1)
	good, bad = sorted[:n], sorted[n:]
	byTrial := func(a, b observation) int { return a.Trial - b.Trial }
	slices.SortFunc(good, byTrial)
	slices.SortFunc(bad, byTrial)
	return good, bad
}

// weights is Optuna's default_weights: 1 for the newest 25, a ramp from
// 1/n up for the older ones.
func weights(n int) []float64 {
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	if n <= 25 {
		return w
	}
	ramp := n - 25
	for i := 0; i < ramp; i++ {
		if ramp == 1 {
			w[i] = 1 / float64(n)
		} else {
			w[i] = 1/float64(n) + (1-1/float64(n))*float64(i)/float64(ramp-1)
		}
	}
	return w
}

func (t *TPE) suggestDim(rng *rand.Rand, key string, good, bad []observation) json.RawMessage {
	d := t.space[key]
	if d.Kind == "choice" {
		l, g := t.categorical(key, good), t.categorical(key, bad)
		best, bestScore := 0, math.Inf(-1)
		for range t.candidates {
			c := drawIndex(rng, l)
			if s := math.Log(l[c]) - math.Log(g[c]); s > bestScore {
				best, bestScore = c, s
			}
		}
		return d.Values[best]
	}
	lo, hi := d.internalRange()
	l, g := t.parzen(key, good, lo, hi), t.parzen(key, bad, lo, hi)
	best, bestScore := 0.0, math.Inf(-1)
	for range t.candidates {
		x := l.draw(rng)
		if s := l.logPDF(x) - g.logPDF(x); s > bestScore {
			best, bestScore = x, s
		}
	}
	return d.external(best)
}

// internalRange is where TPE models a numeric dimension: log space for
// loguniform, half a unit beyond the ends for randint (as Optuna does).
func (d Domain) internalRange() (lo, hi float64) {
	switch d.Kind {
	case "loguniform":
		return math.Log(d.Lo), math.Log(d.Hi)
	case "randint":
		return d.Lo - 0.5, d.Hi - 0.5
	}
	return d.Lo, d.Hi
}

// internal is a config value in the modelling space; ok is false for a
// value that is not this dimension's (a config from elsewhere).
func (d Domain) internal(raw json.RawMessage) (float64, bool) {
	var v float64
	if json.Unmarshal(raw, &v) != nil || !finite(v) {
		return 0, false
	}
	switch d.Kind {
	case "loguniform":
		if v <= 0 {
			return 0, false
		}
		return math.Log(v), true
	}
	return v, true
}

// external is a modelled value back as the dimension's JSON value, within its range.
func (d Domain) external(x float64) json.RawMessage {
	if d.Kind == "loguniform" {
		x = math.Exp(x)
	}
	return d.within(x)
}

// within is a number as the dimension's JSON value, kept in its range: an
// integer in [lo, hi) for randint, else a float in [lo, hi).
func (d Domain) within(v float64) json.RawMessage {
	var out any
	if d.Kind == "randint" {
		out = int64(min(max(math.Round(v), d.Lo), d.Hi-1))
	} else {
		out = min(max(v, d.Lo), math.Nextafter(d.Hi, d.Lo))
	}
	b, _ := json.Marshal(out)
	return b
}

// categorical is the probability of each of a choice's values: weighted
// counts of the group's values plus a uniform prior.
func (t *TPE) categorical(key string, group []observation) []float64 {
	d := t.space[key]
	p := make([]float64, len(d.Values))
	for i := range p {
		p[i] = priorWeight / float64(len(p))
	}
	w := weights(len(group))
	for i, o := range group {
		for c, v := range d.Values {
			if jsonEqual(o.Config[key], v) {
				p[c] += w[i]
				break
			}
		}
	}
	sum := 0.0
	for _, v := range p {
		sum += v
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

func jsonEqual(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

func drawIndex(rng *rand.Rand, p []float64) int {
	u := rng.Float64()
	for i, v := range p {
		if u < v {
			return i
		}
		u -= v
	}
	return len(p) - 1
}

// mixture is a Parzen window: truncated Gaussians on [lo, hi].
type mixture struct {
	lo, hi          float64
	mu, sigma, logW []float64
	weight          []float64
	logZ            []float64 // log of each component's mass within [lo, hi]
	cdfLo, cdfHi    []float64
}

// parzen builds the window over a group's values of a numeric dimension,
// as Optuna's univariate estimator (prior, magic clip, no endpoints).
func (t *TPE) parzen(key string, group []observation, lo, hi float64) *mixture {
	d := t.space[key]
	w := weights(len(group))
	var mus, ws []float64
	for i, o := range group {
		if x, ok := d.internal(o.Config[key]); ok {
			mus = append(mus, min(max(x, lo), hi))
			ws = append(ws, w[i])
		}
	}
	mus = append(mus, (lo+hi)/2) // the prior
	ws = append(ws, priorWeight)
	n := len(mus)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case mus[a] < mus[b]:
			return -1
		case mus[a] > mus[b]:
			return 1
		}
		return 0
	})
	sigma := make([]float64, n)
	for j, i := range order {
		left, right := lo, hi
		if j > 0 {
			left = mus[order[j-1]]
		}
		if j < n-1 {
			right = mus[order[j+1]]
		}
		s := max(mus[i]-left, right-mus[i])
		if n >= 2 && j == 0 {
			s = right - mus[i]
		} else if n >= 2 && j == n-1 {
			s = mus[i] - left
		}
		sigma[i] = s
	}
	maxSigma := hi - lo
	minSigma := (hi - lo) / math.Min(100, 1+float64(n))
	for i := range sigma {
		sigma[i] = min(max(sigma[i], minSigma), maxSigma)
	}
	sigma[n-1] = maxSigma // the prior spans the range
	m := &mixture{lo: lo, hi: hi, mu: mus, sigma: sigma}
	total := 0.0
	for _, v := range ws {
		total += v
	}
	for i := range mus {
		a, b := phi((lo-mus[i])/sigma[i]), phi((hi-mus[i])/sigma[i])
		m.weight = append(m.weight, ws[i]/total)
		m.logW = append(m.logW, math.Log(ws[i]/total))
		m.cdfLo, m.cdfHi = append(m.cdfLo, a), append(m.cdfHi, b)
		m.logZ = append(m.logZ, math.Log(math.Max(b-a, 1e-300)))
	}
	return m
}

func phi(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }

// draw picks a component by weight and draws from it by inverting its CDF.
func (m *mixture) draw(rng *rand.Rand) float64 {
	k := drawIndex(rng, m.weight)
	u := m.cdfLo[k] + rng.Float64()*(m.cdfHi[k]-m.cdfLo[k])
	u = min(max(u, 1e-300), 1-1e-16)
	x := m.mu[k] + m.sigma[k]*math.Sqrt2*math.Erfinv(2*u-1)
	if !finite(x) {
		x = m.mu[k]
	}
	return min(max(x, m.lo), m.hi)
}

// logPDF is the window's log density at x.
func (m *mixture) logPDF(x float64) float64 {
	terms := make([]float64, len(m.mu))
	top := math.Inf(-1)
	for i := range m.mu {
		z := (x - m.mu[i]) / m.sigma[i]
		terms[i] = m.logW[i] - 0.5*z*z - math.Log(m.sigma[i]) - 0.5*math.Log(2*math.Pi) - m.logZ[i]
		top = max(top, terms[i])
	}
	sum := 0.0
	for _, v := range terms {
		sum += math.Exp(v - top)
	}
	return top + math.Log(sum)
}
