package activities

import (
	"strings"
	"testing"
)

// A workflow ID of any length the server allows names a gang the
// collective's handshake can carry, and two long IDs differing only at
// their end name two gangs.
func TestGangRunFitsTheHandshake(t *testing.T) {
	short := "train-20261122"
	if gangRun(short) != short {
		t.Fatalf("a short ID changed: %q", gangRun(short))
	}
	a, b := strings.Repeat("x", 999)+"a", strings.Repeat("x", 999)+"b"
	if len(gangRun(a)) > 255 || gangRun(a) == gangRun(b) || gangRun(a) != gangRun(a) {
		t.Fatalf("%d bytes; distinct: %v", len(gangRun(a)), gangRun(a) != gangRun(b))
	}
	if f := fileSafe("a/b\x00" + strings.Repeat("y", 300)); len(f) > 64 || strings.ContainsAny(f, "/\x00") {
		t.Fatalf("file name part %q", f)
	}
}
