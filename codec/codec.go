// Package codec owns the payload codec that keeps what durabletrain puts in
// Temporal (specs with their exec.env values and URLs, progress, checkpoint
// references) encrypted in history: AES-256-GCM under a key every starter
// and worker of a deployment is given (-codec-key-file), so the server, its
// database and whoever can read the namespace see ciphertext. The Temporal
// UI and CLI read it through a codec server (Handler; `starter
// codec-server`), the way Temporal documents for encrypted payloads.
package codec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/sdk/converter"
)

// Metadata of an encrypted payload.
const (
	Encoding         = "binary/encrypted" // the payload's "encoding"
	MetadataKeyID    = "encryption-key-id"
	MetadataCipher   = "encryption-cipher"
	Cipher           = "AES-256-GCM"
	minKeyBytes      = 32
	nonceBytes       = 12
	metadataEncoding = "encoding"
)

// Codec encrypts payloads with its current key and decrypts payloads of
// that key or of the older keys it was given (key rotation: a new key
// encrypts from now on, history written under the old ones stays readable);
// payloads that were never encrypted pass through Decode unchanged.
type Codec struct {
	id   string
	aead cipher.AEAD
	keys map[string]cipher.AEAD // by key ID: the current key and the older ones
}

var _ converter.PayloadCodec = (*Codec)(nil)

// New derives the AES-256 key from secret (at least 32 bytes: the contents
// of a key file) and names it by a hash that does not reveal it; older keys
// only decrypt.
func New(secret []byte, older ...[]byte) (*Codec, error) {
	c := &Codec{keys: map[string]cipher.AEAD{}}
	for i, k := range append([][]byte{secret}, older...) {
		id, aead, err := derive(k)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			c.id, c.aead = id, aead
		}
		c.keys[id] = aead
	}
	return c, nil
}

func derive(secret []byte) (string, cipher.AEAD, error) {
	if len(secret) < minKeyBytes {
		return "", nil, fmt.Errorf("codec key of %d bytes; want at least %d", len(secret), minKeyBytes)
	}
	key, err := hkdf.Key(sha256.New, secret, nil, "durabletrain payload codec v1", 32)
	if err != nil {
		return "", nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return "", nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(append([]byte("durabletrain payload codec key id\x00"), secret...))
	return hex.EncodeToString(sum[:8]), aead, nil
}

// KeyID names the codec's key in the metadata of what it encrypts.
func (c *Codec) KeyID() string { return c.id }

// DataConverter is the SDK's default converter with this codec after it: the
// client options' DataConverter for starters and workers alike.
func (c *Codec) DataConverter() converter.DataConverter {
	return converter.NewCodecDataConverter(converter.GetDefaultDataConverter(), c)
}

// Handler is the codec server the Temporal UI and CLI call
// (--codec-endpoint) to show encrypted payloads; it answers only to the
// origins allowed (the UI's address), or to none for the CLI alone.
//
// A request's body is read whole before it is decoded (the SDK's handler),
// so no body past MaxRequestBytes is read: one that says its length up front
// is refused with 413, one sent in chunks ends with 400 "http: request body
// too large" once it passes the bound.
func (c *Codec) Handler(allowOrigins ...string) http.Handler {
	h := http.MaxBytesHandler(converter.NewPayloadCodecHTTPHandler(c), MaxRequestBytes)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxRequestBytes {
			http.Error(w, fmt.Sprintf("a request body of %d bytes; the codec server reads at most %d", r.ContentLength, MaxRequestBytes), http.StatusRequestEntityTooLarge)
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" {
			allowed := false
			for _, o := range allowOrigins {
				allowed = allowed || o == origin
			}
			if !allowed {
				http.Error(w, "origin not allowed: start the codec server with -cors-origin "+origin, http.StatusForbidden)
				return
			}
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Set("Access-Control-Allow-Credentials", "true")
			w.Header().Set("Access-Control-Allow-Headers", "Content-Type,X-Namespace,Authorization")
			w.Header().Set("Access-Control-Allow-Methods", "POST,OPTIONS")
			if r.Method == http.MethodOptions {
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// MaxRequestBytes bounds the body of a request to Handler: Temporal caps a
// payload at 2 MiB and a gRPC message at 4 MiB, and the UI decodes a page
// of events at a time, all of it base64 in JSON (4/3 larger).
const MaxRequestBytes = 64 << 20

// Encode encrypts each payload whole (metadata and data), bound to the key's ID.
func (c *Codec) Encode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		plain, err := p.Marshal()
		if err != nil {
			return nil, fmt.Errorf("codec: %w", err)
		}
		nonce := make([]byte, nonceBytes, nonceBytes+len(plain)+c.aead.Overhead())
		if _, err := rand.Read(nonce); err != nil {
			return nil, fmt.Errorf("codec: %w", err)
		}
		out[i] = &commonpb.Payload{
			Metadata: map[string][]byte{
				metadataEncoding: []byte(Encoding),
				MetadataKeyID:    []byte(c.id),
				MetadataCipher:   []byte(Cipher),
			},
			Data: c.aead.Seal(nonce, nonce, plain, []byte(c.id)),
		}
	}
	return out, nil
}

// Decode decrypts the payloads this codec's key encrypted; a payload of
// another key, or altered, is an error that says so; a payload never
// encrypted is returned as it is.
func (c *Codec) Decode(payloads []*commonpb.Payload) ([]*commonpb.Payload, error) {
	out := make([]*commonpb.Payload, len(payloads))
	for i, p := range payloads {
		if string(p.GetMetadata()[metadataEncoding]) != Encoding {
			out[i] = p
			continue
		}
		id := string(p.Metadata[MetadataKeyID])
		aead := c.keys[id]
		if aead == nil {
			return nil, fmt.Errorf("codec: payload encrypted with key %s; this process has key %s (-codec-key-file; list older keys after the current one to read what they encrypted)", id, c.id)
		}
		if cph := string(p.Metadata[MetadataCipher]); cph != Cipher {
			return nil, fmt.Errorf("codec: payload cipher %q; want %q", cph, Cipher)
		}
		if len(p.Data) < nonceBytes+aead.Overhead() {
			return nil, fmt.Errorf("codec: encrypted payload of %d bytes is too short", len(p.Data))
		}
		plain, err := aead.Open(nil, p.Data[:nonceBytes], p.Data[nonceBytes:], []byte(id))
		if err != nil {
			return nil, fmt.Errorf("codec: encrypted payload does not authenticate with key %s: altered or damaged", id)
		}
		var dec commonpb.Payload
		if err := dec.Unmarshal(plain); err != nil {
			return nil, fmt.Errorf("codec: %w", err)
		}
		out[i] = &dec
	}
	return out, nil
}
