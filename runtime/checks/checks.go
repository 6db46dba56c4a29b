// Package checks is what `airlock doctor` reports, whichever backend it
// checks: findings, each with the fix for a failure, and their printing.
package checks

import (
	"fmt"
	"io"
)

// Check is one finding.
type Check struct {
	Name string
	OK   bool
	// Warn is a problem that does not fail the doctor: printed WARN, with
	// its fix.
	Warn   bool
	Detail string
	Fix    string
}

// Print writes one line per check (and the fix under each failure or
// warning) and reports whether all passed (warnings pass).
func Print(w io.Writer, cs []Check) bool {
	ok := true
	for _, c := range cs {
		mark := "ok  "
		switch {
		case c.Warn:
			mark = "WARN"
		case !c.OK:
			mark, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%s %-12s %s\n", mark, c.Name, c.Detail)
		if (c.Warn || !c.OK) && c.Fix != "" {
			fmt.Fprintf(w, "     %-12s fix: %s\n", "", c.Fix)
		}
	}
	return ok
}
