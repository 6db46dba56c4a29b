// Package checks is what `airlock doctor` reports, whichever backend it
// checks: findings, each with the fix for a failure, and their printing.
package checks

import (
	"fmt"
	"io"
)

// Check is one finding.
type Check struct {
	Name   string
	OK     bool
	Detail string
	Fix    string
}

// Print writes one line per check (and the fix under each failure) and
// reports whether all passed.
func Print(w io.Writer, cs []Check) bool {
	ok := true
	for _, c := range cs {
		mark := "ok  "
		if !c.OK {
			mark, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%s %-12s %s\n", mark, c.Name, c.Detail)
		if !c.OK && c.Fix != "" {
			fmt.Fprintf(w, "     %-12s fix: %s\n", "", c.Fix)
		}
	}
	return ok
}
