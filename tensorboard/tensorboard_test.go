package tensorboard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// TFRecord's checksum is CRC-32C (check value 0xE3069283 for "123456789"),
// masked as TensorFlow's crc32c::Mask does.
func TestMaskedCRCIsTensorFlows(t *testing.T) {
	if c := crc32.Checksum([]byte("123456789"), castagnoli); c != 0xE3069283 {
		t.Fatalf("CRC-32C check value %#x", c)
	}
	c := crc32.Checksum([]byte("123456789"), castagnoli)
	if got, want := maskedCRC([]byte("123456789")), ((c>>15)|(c<<17))+0xa282ead8; got != want {
		t.Fatalf("masked %#x, want %#x", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	in := []Event{
		{WallTime: 1.7e9, Step: 1, Scalars: map[string]float64{"loss": 2.25}},
		{WallTime: 1.7e9 + 1, Step: 47, Scalars: map[string]float64{"loss": 0.5, "test_accuracy": 0.75}},
	}
	raw := Encode(1.7e9, in)
	if !bytes.Contains(raw, []byte(FileVersion)) {
		t.Fatal("no file version event")
	}
	out, err := Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[1].Step != 47 || out[1].Scalars["test_accuracy"] != 0.75 || out[0].Scalars["loss"] != 2.25 || out[1].WallTime != 1.7e9+1 {
		t.Fatalf("decoded %+v", out)
	}
	if !bytes.Equal(raw, Encode(1.7e9, in)) {
		t.Fatal("the same events encode to different files")
	}
}

// Damage is reported, never read as data: a flipped byte, a file cut short,
// an absurd length.
func TestDamageIsDetected(t *testing.T) {
	raw := Encode(1, []Event{{WallTime: 1, Step: 3, Scalars: map[string]float64{"loss": 1}}})
	for i := range raw {
		bad := append([]byte{}, raw...)
		bad[i] ^= 0x20
		if _, err := Decode(bytes.NewReader(bad)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: err %v", i, err)
		}
	}
	for cut := 1; cut < len(raw); cut++ {
		events, err := Decode(bytes.NewReader(raw[:cut]))
		if err == nil && cut != len(raw) {
			// Only a cut at a record boundary reads cleanly, with fewer events.
			if len(events) != 0 {
				t.Fatalf("cut at %d: %d events and no error", cut, len(events))
			}
		}
	}
	var huge [12]byte
	binary.LittleEndian.PutUint64(huge[:8], 1<<40)
	binary.LittleEndian.PutUint32(huge[8:], maskedCRC(huge[:8]))
	if _, err := Decode(bytes.NewReader(huge[:])); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a 1 TiB record: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(1, []Event{{WallTime: 1, Step: 3, Scalars: map[string]float64{"loss": 1}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		Decode(bytes.NewReader(b)) // never panics, never allocates past MaxRecordBytes
	})
}
