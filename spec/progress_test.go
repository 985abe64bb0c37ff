package spec

import "testing"

func TestIncidentsStayBounded(t *testing.T) {
	var p Progress
	for g := range 10000 {
		p.AddIncident(Incident{Generation: g, Kind: IncidentGangTimeout, Detail: "only 0 of 2 slots"})
	}
	if len(p.Incidents) != 1 || p.Incidents[0].Repeats != 9999 || p.Incidents[0].Generation != 9999 {
		t.Fatalf("10000 gang timeouts in a row: %+v", p.Incidents)
	}
	for g := range 500 {
		p.AddIncident(Incident{Generation: g, Kind: []string{IncidentFailure, IncidentGangTimeout}[g%2]})
	}
	if len(p.Incidents) != MaxIncidents || p.IncidentsDropped != 401 || p.Incidents[MaxIncidents-1].Generation != 499 {
		t.Fatalf("%d incidents, %d dropped, last %+v", len(p.Incidents), p.IncidentsDropped, p.Incidents[len(p.Incidents)-1])
	}
}
