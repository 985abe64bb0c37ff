package tune

import (
	"encoding/json"
	"fmt"
)

// A search continues as new when its history grows long, and its scheduler
// goes on where it was: State and SetState carry what a scheduler has seen
// (deterministic JSON, map keys sorted), and Forget lets go of what a
// finished trial no longer needs, so the state grows with what decisions
// still read.

// State is the scheduler's state as JSON (null for one that keeps none).
func State(s Scheduler) (json.RawMessage, error) {
	switch s := s.(type) {
	case *ASHA:
		st := ashaState{}
		for _, r := range s.rungs {
			st.Rungs = append(st.Rungs, rungState{Milestone: r.milestone, Recorded: r.recorded, Order: r.order})
		}
		return json.Marshal(st)
	case *Median:
		return json.Marshal(medianState{History: s.history, Order: s.order})
	case *PBT:
		return json.Marshal(pbtState{Latest: s.latest, Perturbed: s.perturbed})
	}
	return json.RawMessage("null"), nil
}

// SetState restores a state State returned, into a scheduler New made from
// the same configuration.
func SetState(s Scheduler, state json.RawMessage) error {
	if len(state) == 0 || string(state) == "null" {
		return nil
	}
	switch s := s.(type) {
	case *ASHA:
		var st ashaState
		if err := json.Unmarshal(state, &st); err != nil {
			return fmt.Errorf("asha state: %w", err)
		}
		if len(st.Rungs) != len(s.rungs) {
			return fmt.Errorf("asha state has %d rungs; the scheduler has %d", len(st.Rungs), len(s.rungs))
		}
		for i, r := range st.Rungs {
			if r.Milestone != s.rungs[i].milestone {
				return fmt.Errorf("asha state: rung %d at %d; the scheduler's is at %d", i, r.Milestone, s.rungs[i].milestone)
			}
			if r.Recorded == nil {
				r.Recorded = map[int]float64{}
			}
			s.rungs[i].recorded, s.rungs[i].order = r.Recorded, r.Order
		}
	case *Median:
		var st medianState
		if err := json.Unmarshal(state, &st); err != nil {
			return fmt.Errorf("median state: %w", err)
		}
		if st.History == nil {
			st.History = map[int][]float64{}
		}
		s.history, s.order = st.History, st.Order
	case *PBT:
		var st pbtState
		if err := json.Unmarshal(state, &st); err != nil {
			return fmt.Errorf("pbt state: %w", err)
		}
		if st.Latest == nil {
			st.Latest = map[int]float64{}
		}
		if st.Perturbed == nil {
			st.Perturbed = map[int]int{}
		}
		s.latest, s.perturbed = st.Latest, st.Perturbed
	default:
		return fmt.Errorf("a state for a scheduler that keeps none")
	}
	return nil
}

// Forget lets go of a finished trial: ASHA judged it already at every
// rung it reached (its values stay in the rungs' quantiles); the median
// rule still compares others with its running means, so it keeps them; PBT
// ranks only the trials still running.
func Forget(s Scheduler, trial int) {
	switch s := s.(type) {
	case *ASHA:
		for i := range s.rungs {
			delete(s.rungs[i].recorded, trial)
		}
	case *PBT: // it ranks running trials only
		delete(s.latest, trial)
		delete(s.perturbed, trial)
	}
}

type ashaState struct {
	Rungs []rungState `json:"rungs"`
}

type rungState struct {
	Milestone int             `json:"milestone"`
	Recorded  map[int]float64 `json:"recorded"`
	Order     []float64       `json:"order"`
}

type medianState struct {
	History map[int][]float64 `json:"history"`
	Order   []int             `json:"order"`
}
