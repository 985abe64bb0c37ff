package strictjson

import (
	"fmt"
	"unicode/utf8"
)

// Quote shows a user's string in an error message, Go-quoted and bounded:
// past 64 bytes it keeps the first 48 (whole runes) and says how long it was.
func Quote(s string) string {
	if len(s) > 64 {
		cut := 48
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q… (%d bytes)", s[:cut], len(s))
	}
	return fmt.Sprintf("%q", s)
}
