// Package tensorboard owns the TensorBoard event file format: TFRecord
// framing (length, masked CRC-32C, data, masked CRC-32C) around Event
// protocol buffers holding scalar summaries. Runs write one such file per
// epoch beside their checkpoints (`tensorboard --logdir` reads the run's
// tensorboard/ directory); `starter plot` reads them back. Only scalars are
// written; reading skips every other kind of event.
package tensorboard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// Event is the scalars recorded at one step.
type Event struct {
	WallTime float64            // seconds since the Unix epoch
	Step     int64              // the global step
	Scalars  map[string]float64 // tag → value (stored as float32, as TensorBoard's simple_value)
}

// FileVersion is the first event of every file, as TensorFlow writes it.
const FileVersion = "brain.Event:2"

// MaxRecordBytes bounds one record when reading: ours are tiny, and a
// damaged length field must not make a reader allocate gigabytes.
const MaxRecordBytes = 16 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is TFRecord's checksum: CRC-32C, rotated and offset.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// Encode is a whole event file: the file version, then the events in order.
func Encode(wallTime float64, events []Event) []byte {
	var buf bytes.Buffer
	writeRecord(&buf, encodeEvent(wallTime, 0, FileVersion, nil))
	for _, e := range events {
		writeRecord(&buf, encodeEvent(e.WallTime, e.Step, "", e.Scalars))
	}
	return buf.Bytes()
}

func writeRecord(w *bytes.Buffer, data []byte) {
	var head [12]byte
	binary.LittleEndian.PutUint64(head[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(head[8:], maskedCRC(head[:8]))
	w.Write(head[:])
	w.Write(data)
	binary.Write(w, binary.LittleEndian, maskedCRC(data))
}

// Event fields (tensorflow/core/util/event.proto) and Summary's.
const (
	fieldWallTime    = 1 // double
	fieldStep        = 2 // int64
	fieldFileVersion = 3 // string
	fieldSummary     = 5 // Summary
	fieldValue       = 1 // Summary.value: repeated Value
	fieldTag         = 1 // Value.tag
	fieldSimpleValue = 2 // Value.simple_value: float
)

func encodeEvent(wallTime float64, step int64, fileVersion string, scalars map[string]float64) []byte {
	var b []byte
	b = protowire.AppendTag(b, fieldWallTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, math.Float64bits(wallTime))
	if step != 0 {
		b = protowire.AppendTag(b, fieldStep, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(step))
	}
	if fileVersion != "" {
		b = protowire.AppendTag(b, fieldFileVersion, protowire.BytesType)
		b = protowire.AppendString(b, fileVersion)
	}
	if len(scalars) > 0 {
		tags := make([]string, 0, len(scalars))
		for t := range scalars {
			tags = append(tags, t)
		}
		sort.Strings(tags) // deterministic files
		var summary []byte
		for _, t := range tags {
			var v []byte
			v = protowire.AppendTag(v, fieldTag, protowire.BytesType)
			v = protowire.AppendString(v, t)
			v = protowire.AppendTag(v, fieldSimpleValue, protowire.Fixed32Type)
			v = protowire.AppendFixed32(v, math.Float32bits(float32(scalars[t])))
			summary = protowire.AppendTag(summary, fieldValue, protowire.BytesType)
			summary = protowire.AppendBytes(summary, v)
		}
		b = protowire.AppendTag(b, fieldSummary, protowire.BytesType)
		b = protowire.AppendBytes(b, summary)
	}
	return b
}

// ErrCorrupt: a record's length or checksum is wrong, or it does not parse.
var ErrCorrupt = errors.New("tensorboard: corrupt event file")

// Decode reads every scalar event of a file, checking each record's
// checksums. The file-version event and events without scalars are skipped.
// A file cut short after its last whole record (a writer killed mid-write)
// yields the records before the cut and ErrCorrupt.
func Decode(r io.Reader) ([]Event, error) {
	var out []Event
	for n := 0; ; n++ {
		var head [12]byte
		if _, err := io.ReadFull(r, head[:]); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("%w: record %d: header: %v", ErrCorrupt, n, err)
		}
		if maskedCRC(head[:8]) != binary.LittleEndian.Uint32(head[8:]) {
			return out, fmt.Errorf("%w: record %d: length checksum", ErrCorrupt, n)
		}
		size := binary.LittleEndian.Uint64(head[:8])
		if size > MaxRecordBytes {
			return out, fmt.Errorf("%w: record %d of %d bytes (at most %d)", ErrCorrupt, n, size, MaxRecordBytes)
		}
		data := make([]byte, size+4)
		if _, err := io.ReadFull(r, data); err != nil {
			return out, fmt.Errorf("%w: record %d: %v", ErrCorrupt, n, err)
		}
		if maskedCRC(data[:size]) != binary.LittleEndian.Uint32(data[size:]) {
			return out, fmt.Errorf("%w: record %d: data checksum", ErrCorrupt, n)
		}
		e, err := decodeEvent(data[:size])
		if err != nil {
			return out, fmt.Errorf("%w: record %d: %v", ErrCorrupt, n, err)
		}
		if len(e.Scalars) > 0 {
			out = append(out, e)
		}
	}
}

func decodeEvent(b []byte) (Event, error) {
	e := Event{Scalars: map[string]float64{}}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return e, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == fieldWallTime && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			e.WallTime, b = math.Float64frombits(v), b[n:]
		case num == fieldStep && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			e.Step, b = int64(v), b[n:]
		case num == fieldSummary && typ == protowire.BytesType:
			s, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			b = b[n:]
			if err := decodeSummary(s, e.Scalars); err != nil {
				return e, err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return e, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return e, nil
}

func decodeSummary(b []byte, into map[string]float64) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num != fieldValue || typ != protowire.BytesType {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var tag string
		var value float64
		simple := false
		for len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			if n < 0 {
				return protowire.ParseError(n)
			}
			v = v[n:]
			switch {
			case num == fieldTag && typ == protowire.BytesType:
				s, n := protowire.ConsumeString(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				tag, v = s, v[n:]
			case num == fieldSimpleValue && typ == protowire.Fixed32Type:
				f, n := protowire.ConsumeFixed32(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				value, simple, v = float64(math.Float32frombits(f)), true, v[n:]
			default:
				n := protowire.ConsumeFieldValue(num, typ, v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				v = v[n:]
			}
		}
		if simple && tag != "" {
			into[tag] = value
		}
	}
	return nil
}
