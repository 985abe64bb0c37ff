package codec

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
)

var secret = []byte("0123456789abcdef0123456789abcdef-codec")

func TestRoundTripHidesThePayload(t *testing.T) {
	c, err := New(secret)
	if err != nil {
		t.Fatal(err)
	}
	dc := c.DataConverter()
	in := map[string]any{"exec": map[string]any{"env": map[string]string{"WANDB_API_KEY": "hunter2"}}}
	p, err := dc.ToPayload(in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(p.Data, []byte("hunter2")) || string(p.Metadata["encoding"]) != Encoding || string(p.Metadata[MetadataKeyID]) != c.KeyID() {
		t.Fatalf("encoded payload shows its contents or lacks its metadata: %v", p)
	}
	var out map[string]any
	if err := dc.FromPayload(p, &out); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(out); !bytes.Contains(b, []byte("hunter2")) {
		t.Fatalf("decoded %s", b)
	}
	// The same value twice encrypts differently (a fresh nonce each time).
	p2, _ := dc.ToPayload(in)
	if bytes.Equal(p.Data, p2.Data) {
		t.Fatal("two encryptions of one value are identical")
	}
}

func TestDecodeRefusesOtherKeysAndAlteredPayloads(t *testing.T) {
	c, _ := New(secret)
	other, _ := New([]byte("another-secret-of-at-least-32-bytes-long"))
	enc, _ := c.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"x"`)}})
	if _, err := other.Decode(enc); err == nil || !strings.Contains(err.Error(), c.KeyID()) || !strings.Contains(err.Error(), other.KeyID()) {
		t.Errorf("another key: %v; want an error naming both key IDs", err)
	}
	for name, alter := range map[string]func(p *commonpb.Payload){
		"flipped bit": func(p *commonpb.Payload) { p.Data[len(p.Data)-1] ^= 1 },
		"truncated":   func(p *commonpb.Payload) { p.Data = p.Data[:5] },
		"cipher":      func(p *commonpb.Payload) { p.Metadata[MetadataCipher] = []byte("none") },
	} {
		p := &commonpb.Payload{Metadata: map[string][]byte{}, Data: append([]byte(nil), enc[0].Data...)}
		for k, v := range enc[0].Metadata {
			p.Metadata[k] = v
		}
		alter(p)
		if _, err := c.Decode([]*commonpb.Payload{p}); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	plain := &commonpb.Payload{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`1`)}
	if out, err := c.Decode([]*commonpb.Payload{plain}); err != nil || out[0] != plain {
		t.Errorf("a payload never encrypted: %v", err)
	}
	if _, err := New([]byte("short")); err == nil {
		t.Error("a 5-byte key was accepted")
	}
}

// TestHandlerDecodesForTheUIAndCLI: the codec server decodes what the
// codec encoded, and answers browsers only from the origins it allows.
func TestHandlerDecodesForTheUIAndCLI(t *testing.T) {
	c, _ := New(secret)
	srv := httptest.NewServer(c.Handler("http://localhost:8233"))
	defer srv.Close()
	remote := converter.NewRemotePayloadCodec(converter.RemotePayloadCodecOptions{Endpoint: srv.URL})
	enc, _ := c.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"secret spec"`)}})
	dec, err := remote.Decode(enc)
	if err != nil || string(dec[0].Data) != `"secret spec"` {
		t.Fatalf("through the codec server: %v %v", dec, err)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/decode", strings.NewReader(`{"payloads":[]}`))
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a page from another origin got %d; want 403", resp.StatusCode)
	}
}

// A body past MaxRequestBytes is refused, whether it says its length up
// front (413) or comes in chunks (400 once it passes the bound; without the
// bound the handler reads it all and fails on its JSON instead), and the
// server goes on decoding.
func TestHandlerRefusesABodyPastItsBound(t *testing.T) {
	c, _ := New(secret)
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	body := func() io.Reader {
		return io.MultiReader(strings.NewReader(`{"payloads":[{"data":"`), io.LimitReader(endlessA{}, MaxRequestBytes))
	}
	for _, c := range []struct {
		name    string
		length  int64 // -1: chunked, no length up front
		status  int
		message string
	}{
		{"with its length", MaxRequestBytes + 22, http.StatusRequestEntityTooLarge, "reads at most"},
		{"in chunks", -1, http.StatusBadRequest, "request body too large"},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/decode", body())
		req.ContentLength = c.length
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(msg), c.message) {
			t.Fatalf("%s: a body past the bound got %d %q; want %d naming %q", c.name, resp.StatusCode, msg, c.status, c.message)
		}
	}
	remote := converter.NewRemotePayloadCodec(converter.RemotePayloadCodecOptions{Endpoint: srv.URL})
	enc, _ := c.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"after"`)}})
	if dec, err := remote.Decode(enc); err != nil || string(dec[0].Data) != `"after"` {
		t.Fatalf("after the large bodies: %v %v", dec, err)
	}
}

// endlessA reads as 'A' forever.
type endlessA struct{}

func (endlessA) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'A'
	}
	return len(p), nil
}

// TestRotation: a codec given a new key and the old one encrypts with the new
// and still reads what the old one encrypted; without the old key it cannot.
func TestRotation(t *testing.T) {
	old, _ := New(secret)
	newKey := []byte("the-new-key-of-at-least-32-bytes-long!!")
	rotated, err := New(newKey, secret)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := old.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"old"`)}})
	if out, err := rotated.Decode(before); err != nil || string(out[0].Data) != `"old"` {
		t.Fatalf("the rotated codec reading the old key's payload: %v", err)
	}
	after, _ := rotated.Encode([]*commonpb.Payload{{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(`"new"`)}})
	if string(after[0].Metadata[MetadataKeyID]) == old.KeyID() {
		t.Fatal("the rotated codec still encrypts with the old key")
	}
	if _, err := old.Decode(after); err == nil {
		t.Fatal("the old codec read a payload of the new key")
	}
	newOnly, _ := New(newKey)
	if _, err := newOnly.Decode(before); err == nil || !strings.Contains(err.Error(), "older keys") {
		t.Fatalf("without the old key: %v", err)
	}
}
