// Command airlock-driver is the init process of every airlock sandbox. It
// is built statically and placed in the sandbox image; see package
// runtime/driver.
package main

import (
	"os"

	"github.com/airlock-mcp/airlock/runtime/driver"
)

func main() {
	os.Exit(driver.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
