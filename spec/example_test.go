package spec_test

import (
	"fmt"

	"github.com/durabletrain/durabletrain/spec"
)

// A folder whose name has a space or a '#' gets a URL that names it, and
// that a spec accepts.
func ExampleFileURL() {
	url := spec.FileURL("/home/me/My Runs/fashion #2") + "?create_dir=1"
	fmt.Println(url)
	fmt.Println(spec.CheckURL("checkpoint.url", url))
	fmt.Println(spec.CheckURL("checkpoint.url", "file:///home/me/My Runs/fashion #2"))
	// Output:
	// file:///home/me/My%20Runs/fashion%20%232?create_dir=1
	// <nil>
	// checkpoint.url is "file:///home/me/My Runs/fashion #2"; want a URL without spaces or control characters (escape them as %20, …)
}
