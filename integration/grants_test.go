package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
)

// writeKey writes a pool key file as an operator would (mode 600).
func writeKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pool.key")
	if err := os.WriteFile(path, []byte(rand.Text()+rand.Text()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestForgedGrantCannotJoinAGang makes the attack of someone who can signal
// workflows but is not a worker of the pool: while a 2-rank run waits for its
// second slot, a forged slot-granted signal places that rank on the
// attacker's queue and address. The attacker receives its rank's RunEpoch
// (the spec, which history shows anyway) but no secret: the real rank
// refuses to join a gang whose placement the pool key does not prove, the
// run records why, forms its next gang on real workers and completes, and
// its checkpoints carry the pool's signature.
func TestForgedGrantCannotJoinAGang(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-forged"
	key := writeKey(t)
	pool := append(append([]string{}, testPolicy...), "-pool-key-file", key)
	startWorker(t, "forged-ctl", "workflows", queue)
	startWorkerWith(t, "forged-a", "agent", queue, pool)
	c := dial(t)
	s := subsetSpec(t, queue, 2, 2)
	s.Failure.MaxFailures = spec.Int(0) // the forgery must not cost the run its budget
	run := startRun(t, c, "it-forged", queue, s)
	deadline := time.Now().Add(30 * time.Second)
	for p := progress(t, c, "it-forged"); p == nil || p.Generation != 1; p = progress(t, c, "it-forged") {
		if time.Now().After(deadline) {
			t.Fatal("the run did not start forming its first gang")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the real agent has granted its slot
	attackerQueue := queue + "-attacker"
	for request := range 2 { // whichever request the real agent did not take
		pub := make([]byte, 32)
		rand.Read(pub)
		if err := c.SignalWorkflow(context.Background(), "it-forged", "", spec.SignalSlotGranted, spec.SlotGranted{
			Generation: 1, Request: request, Placement: spec.Placement{Worker: "attacker", HostQueue: attackerQueue, Collective: "127.0.0.1:9", PublicKey: pub},
		}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // the epoch fails on the forged placement
	startWorkerWith(t, "forged-b", "agent", queue, pool)
	p := awaitRun(t, run, 2*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != 2 {
		t.Fatalf("run ended %s at epoch %d", p.State, p.Epoch)
	}
	refused := false
	for _, inc := range p.Incidents {
		refused = refused || inc.Kind == spec.IncidentForgedGrant && strings.Contains(inc.Detail, "is not signed with this worker pool's key")
	}
	if !refused || p.Failures != 0 {
		t.Fatalf("want a forged-grant incident, not charged as a failure; got %d failures, incidents %+v", p.Failures, p.Incidents)
	}
	// What the attacker's queue was sent: no secret, only public keys.
	sentToAttacker := 0
	it := c.GetWorkflowHistory(context.Background(), "it-forged", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		a := e.GetActivityTaskScheduledEventAttributes()
		if a == nil || a.TaskQueue.GetName() != attackerQueue {
			continue
		}
		var in map[string]json.RawMessage
		json.Unmarshal(a.Input.Payloads[0].Data, &in)
		if a.GetActivityType().GetName() != spec.ActivityRunEpoch {
			// The run also tells the host to let go of its hold (ReleaseHold):
			// the hold's generation, request and run ID, nothing secret.
			if _, ok := in["secret"]; ok || len(in) > 3 {
				t.Fatalf("the forged rank's queue was sent %s by %s; want no secret", a.Input.Payloads[0].Data, a.GetActivityType().GetName())
			}
			continue
		}
		sentToAttacker++
		var hosts []spec.Placement
		json.Unmarshal(in["hosts"], &hosts)
		keys := len(hosts) > 0
		for _, h := range hosts {
			keys = keys && len(h.PublicKey) > 0
		}
		if _, ok := in["secret"]; ok || !keys {
			t.Fatalf("the forged rank's RunEpoch input carries %s; want no secret, only its hosts' public keys", a.Input.Payloads[0].Data)
		}
	}
	if sentToAttacker == 0 {
		t.Fatal("the forged grant was never accepted by the workflow: the test proved nothing")
	}
	store, err := checkpoint.Open(context.Background(), p.Latest.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ck, err := store.Verify(context.Background(), p.Latest.Run, p.Latest.ID)
	if err != nil || ck.Manifest.Signature == "" {
		t.Fatalf("the run's checkpoint is not signed by the pool: %v", err)
	}
}
