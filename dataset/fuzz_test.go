package dataset

import (
	"bytes"
	"compress/gzip"
	"context"
	"testing"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/memblob"
)

// FuzzIDXFromAnywhere loads a data set whose two files hold anything (a
// run's spec names its data set's URL, so its files are anyone's): the
// loader never panics and never allocates past its bound, and what it
// returns holds together: as many labels as images, each image Rows*Cols
// values, every label a class.
func FuzzIDXFromAnywhere(f *testing.F) {
	raw := func(gz []byte) []byte {
		r, _ := gzip.NewReader(bytes.NewReader(gz))
		var b bytes.Buffer
		b.ReadFrom(r)
		return b.Bytes()
	}
	f.Add(raw(idxFile(idxImagesMagic, []uint32{3, 2, 2}, make([]byte, 12))), raw(idxFile(idxLabelsMagic, []uint32{3}, []byte{0, 1, 9})))
	f.Add(raw(idxFile(idxImagesMagic, []uint32{2_100_000, 2_100_000, 2_100_000}, nil)), raw(idxFile(idxLabelsMagic, []uint32{1}, []byte{0})))
	f.Add(raw(idxFile(idxImagesMagic, []uint32{1 << 22, 1 << 22, 1 << 20}, nil)), raw(idxFile(idxLabelsMagic, []uint32{1 << 22}, nil)))
	f.Fuzz(func(t *testing.T, images, labels []byte) {
		ctx := context.Background()
		b, err := blob.OpenBucket(ctx, "mem://")
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for name, content := range map[string][]byte{"train-images-idx3-ubyte.gz": images, "train-labels-idx1-ubyte.gz": labels} {
			var z bytes.Buffer
			w := gzip.NewWriter(&z)
			w.Write(content)
			w.Close()
			b.WriteAll(ctx, name, z.Bytes(), nil)
		}
		s, err := loadFrom(ctx, b, "mem://", Train)
		if err != nil {
			return
		}
		if s.Len() == 0 || len(s.Images) != s.Len()*s.Features() {
			t.Fatalf("loaded %d labels and %d values of %dx%d images", s.Len(), len(s.Images), s.Rows, s.Cols)
		}
		for i, l := range s.Labels {
			if l >= Classes {
				t.Fatalf("label %d of example %d", l, i)
			}
		}
	})
}
