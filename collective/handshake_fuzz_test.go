package collective

import (
	"bytes"
	"testing"
)

// FuzzHelloFromAStranger reads the first bytes anyone who can reach a
// collective listener may send: readHello never panics and never reads
// past the hello it returns; what it accepts is exactly what encode would
// have sent for it, so two readers of the same bytes agree on the run,
// generation, link and flags that a connection claims.
func FuzzHelloFromAStranger(f *testing.F) {
	var nonce [nonceLen]byte
	for i := range nonce {
		nonce[i] = byte(i)
	}
	f.Add(hello{Run: "run-1", Generation: 3, From: 1, To: 2, World: 4, Nonce: nonce}.encode())
	f.Add(hello{Run: "r", Generation: 1, From: 0, To: 1, World: 2, Flags: flagGatherLinks, Nonce: nonce}.encode())
	f.Add(append(handshakeMagicFlags[:], 0, 1, 'r'))
	f.Add(append(handshakeMagic[:], 0xff, 0xff))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, err := readHello(r)
		if err != nil {
			return
		}
		consumed := data[:len(data)-r.Len()]
		if got := h.encode(); !bytes.Equal(got, consumed) {
			t.Fatalf("readHello accepted %x as %+v, which encodes as %x", consumed, h, got)
		}
		if len(h.Run) == 0 || len(h.Run) > maxRunLen {
			t.Fatalf("accepted a run name of %d bytes", len(h.Run))
		}
	})
}
