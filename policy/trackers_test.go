package policy

import (
	"strings"
	"testing"
)

// A worker makes requests only to the tracking servers its -trackers lists:
// the same scheme, host and port, at or under the listed path.
func TestCheckTrackerAllowsOnlyTheListedServers(t *testing.T) {
	p := Policy{Trackers: []string{"http://mlflow.internal:5000", "https://tracking.example.com/team-a"}}
	for _, ok := range []string{
		"http://mlflow.internal:5000", "http://mlflow.internal:5000/", "http://MLflow.Internal:5000/x",
		"https://tracking.example.com/team-a", "https://tracking.example.com/team-a/sub",
	} {
		if err := p.CheckTracker(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"http://mlflow.internal:5001",             // another port
		"https://mlflow.internal:5000",            // another scheme
		"http://mlflow.internal",                  // the default port is another port
		"http://169.254.169.254/latest/meta-data", // the cloud's metadata
		"https://tracking.example.com/team-b",
		"https://tracking.example.com/team-ab",
		"https://tracking.example.com/team-a/../team-b",
		"https://tracking.example.com/team-a/%2e%2e/team-b",
		"http://mlflow.internal.evil.com:5000",
	} {
		err := p.CheckTracker(bad)
		if err == nil || !strings.Contains(err.Error(), "not among this worker's -trackers") {
			t.Errorf("%s: %v; want a refusal naming -trackers", bad, err)
		}
	}
	if err := p.CheckTracker("http://u:p@mlflow.internal:5000"); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Errorf("credentials: %v", err)
	}
	err := (Policy{}).CheckTracker("http://mlflow.internal:5000/x")
	if err == nil || !strings.Contains(err.Error(), "start it with -trackers http://mlflow.internal:5000") {
		t.Errorf("no -trackers: %v", err)
	}
	if err := (Policy{Trackers: []string{"*"}}).CheckTracker("http://anything:1"); err != nil {
		t.Errorf("*: %v", err)
	}
}

func TestParseTrackers(t *testing.T) {
	got, err := ParseTrackers("-trackers", " http://a:5000, https://b/x ,")
	if err != nil || len(got) != 2 || got[0] != "http://a:5000" || got[1] != "https://b/x" {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := ParseTrackers("-trackers", ""); err != nil || got != nil {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"file:///tmp", "a:5000", ",,", "http://u:p@a"} {
		if _, err := ParseTrackers("-trackers", bad); err == nil || !strings.Contains(err.Error(), "-trackers") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
