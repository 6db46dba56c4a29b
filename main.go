// Command airlock is an MCP server that runs AI agents' Python and shell code
// in gVisor sandboxes. The command line itself lives in cli/, one file per
// command.
package main

import (
	"os"

	"github.com/airlock-mcp/airlock/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() { os.Exit(cli.Main(version)) }
