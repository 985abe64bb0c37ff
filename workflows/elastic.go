package workflows

import (
	"fmt"
	"slices"

	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// probe asks for the slots a degraded gang lacks, as the next generation's
// extra ranks; the slots it gets are held until the gang grows at an epoch
// boundary (growGang), or released with the gang.
type probe struct {
	generation int
	requests   []int
	holds      []workflow.Future
	release    workflow.CancelFunc
	placements map[int]spec.Placement
	failed     bool
}

// growGang, at an epoch boundary of a degraded gang, starts a probe for the
// missing slots or, once the probe holds them all, makes the next gang: the
// current ranks and the probe's, which restore from the checkpoint just taken.
func (r *run) growGang(ctx workflow.Context) {
	g, workers := r.gang, r.spec.Scaling.Hosts()
	if g == nil || len(g.placements) >= workers || !r.elastic {
		return
	}
	if r.probe == nil || r.probe.failed {
		r.startProbe(ctx, len(g.placements), workers)
		return
	}
	pr := r.probe
	for {
		s, received := r.takeGrant(ctx, r.grants)
		if !received {
			break
		}
		if s != nil && s.Generation == pr.generation && slices.Contains(pr.requests, s.Request) {
			pr.placements[s.Request] = s.Placement
		}
	}
	if len(pr.placements) < len(pr.requests) {
		return
	}
	grown := &gang{generation: pr.generation, secret: nil,
		placements: append([]spec.Placement{}, g.placements...), holds: append([]workflow.Future{}, g.holds...),
		holdIDs: append([]holdID{}, g.holdIDs...)}
	for i, req := range pr.requests {
		pl := pr.placements[req]
		pl.Rank = len(grown.placements) * max(1, r.spec.Scaling.WorkersPerHost)
		grown.placements = append(grown.placements, pl)
		grown.holdIDs = append(grown.holdIDs, holdID{pr.generation, req})
		grown.holds = append(grown.holds, pr.holds[i])
	}
	oldRelease, probeRelease := g.release, pr.release
	grown.release = func() { oldRelease(); probeRelease() }
	if !r.rankKeys {
		workflow.SideEffect(ctx, func(workflow.Context) any { return newSecret() }).Get(&grown.secret)
	}
	r.p.AddIncident(spec.Incident{Generation: grown.generation, Epoch: r.p.Epoch, Kind: spec.IncidentResized,
		Detail: fmt.Sprintf("grew from %d to %d ranks", g.world(r.spec), grown.world(r.spec))})
	r.gang, r.probe = grown, nil
	r.p.Gang, r.p.World = grown.placements, grown.world(r.spec)
}

// startProbe (re)starts the probe for hosts have..workers-1 as a new generation.
func (r *run) startProbe(ctx workflow.Context, have, workers int) {
	if r.probe != nil {
		r.letGo(ctx, r.probe.held(workflow.GetInfo(ctx).WorkflowExecution.RunID), false)
		r.probe.release()
	}
	r.p.Generation++
	pr := &probe{generation: r.p.Generation, placements: map[int]spec.Placement{}}
	for i := have; i < workers; i++ {
		pr.requests = append(pr.requests, i)
	}
	pr.holds, _, pr.release = r.holdSlots(ctx, pr.generation, pr.requests)
	for _, h := range pr.holds {
		workflow.Go(ctx, func(ctx workflow.Context) {
			h.Get(ctx, nil)
			pr.failed = true // a probe's slot that ends (no slot in time, a lost worker) spoils the probe
		})
	}
	r.probe = pr
}
