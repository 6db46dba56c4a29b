//go:build !linux

package driver

import (
	"fmt"
	"io"
)

// Main needs Linux: the driver runs inside a gVisor sandbox.
func Main(_ []string, _ io.Reader, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "airlock-driver runs only on Linux")
	return 2
}
