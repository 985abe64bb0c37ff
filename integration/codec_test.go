package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/durabletrain/durabletrain/codec"
	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/keyfile"
	"github.com/durabletrain/durabletrain/spec"
)

// TestHistoryHoldsOnlyCiphertext: a starter and workers given the same
// -codec-key-file train a run; every payload of its history (the spec, the
// slot grants, each epoch's input and result, the progress) is AES-GCM
// ciphertext to a client without the key, no URL or secret of the spec shows
// in the raw history, and the Temporal CLI shows the spec through the codec
// server.
func TestHistoryHoldsOnlyCiphertext(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-codec"
	keyPath := writeKey(t)
	withKey := append(append([]string{}, testPolicy...), "-codec-key-file", keyPath)
	startWorkerWith(t, "codec-ctl", "workflows", queue, withKey)
	startWorkerWith(t, "codec-agent", "agent", queue, withKey)
	c, err := connect.Options{Address: server.Addr(), Namespace: "default", CodecKeyFile: keyPath}.Dial(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := subsetSpec(t, queue, 1, 1)
	s.Name = "codec-run-with-a-recognisable-name"
	run := startRun(t, c, "it-codec", queue, s)
	p := awaitRun(t, run, 2*time.Minute)
	if p.State != spec.StateCompleted {
		t.Fatalf("run ended %s", p.State)
	}

	plain := dial(t) // no key: what the server and its database hold
	it := plain.GetWorkflowHistory(context.Background(), "it-codec", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	payloads := 0
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(e)
		for _, leak := range []string{s.Name, "fashion-mnist", s.Checkpoint.URL} {
			if bytes.Contains(raw, []byte(leak)) {
				t.Fatalf("event %d (%s) shows %q in the clear", e.EventId, e.EventType, leak)
			}
		}
		if e.GetUpsertWorkflowSearchAttributesEventAttributes() != nil {
			continue // search attributes are indexed by the server: plain by design (TemporalChangeVersion here)
		}
		forEachPayload(e, func(p *commonpb.Payload) {
			payloads++
			if string(p.Metadata["encoding"]) != codec.Encoding {
				t.Errorf("event %d (%s): a payload encoded %q, not encrypted", e.EventId, e.EventType, p.Metadata["encoding"])
			}
		})
	}
	if payloads < 5 {
		t.Fatalf("only %d payloads in the history: the test looked in the wrong places", payloads)
	}
	t.Logf("%d payloads in the history, every one encrypted", payloads)

	// The CLI, through the codec server, shows the spec to whoever holds the key.
	cli := temporalCLI(t)
	key, _ := keyfile.Read(keyPath, "key")
	cd, _ := codec.New(key)
	srv := httptest.NewServer(cd.Handler())
	defer srv.Close()
	out, err := exec.Command(cli, "workflow", "show", "--workflow-id", "it-codec", "--address", server.Addr(), "--namespace", "default",
		"--codec-endpoint", srv.URL).CombinedOutput()
	if err != nil {
		t.Fatalf("temporal workflow show: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(s.Name)) {
		enc, _ := exec.Command(cli, "workflow", "show", "--workflow-id", "it-codec", "--address", server.Addr(), "--namespace", "default", "--output", "json", "--codec-endpoint", srv.URL).CombinedOutput()
		t.Logf("json: %s", enc[:min(len(enc), 6000)])
		t.Fatalf("the CLI with the codec endpoint does not show the spec:\n%.2000s", out)
	}
}

// forEachPayload calls f for every Payload anywhere in a history event.
func forEachPayload(m proto.Message, f func(*commonpb.Payload)) {
	var walk func(protoreflect.Message)
	walk = func(m protoreflect.Message) {
		if p, ok := m.Interface().(*commonpb.Payload); ok {
			f(p)
			return
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range v.List().Len() {
					walk(v.List().Get(i).Message())
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { walk(mv.Message()); return true })
			case fd.Message() != nil && !fd.IsMap():
				walk(v.Message())
			}
			return true
		})
	}
	walk(m.ProtoReflect())
}
