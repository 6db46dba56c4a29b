package runtime

import "github.com/airlock-mcp/airlock/runtime/driver"

// CodeDir is where a run's code (and, for networked runs, pip.conf and the
// CA bundle) is placed inside the sandbox: a root-owned tmpfs the driver
// writes and the code can only read.
const CodeDir = driver.CodeDir
