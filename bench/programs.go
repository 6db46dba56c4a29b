// Package bench measures airlock against its floor and its peers, all in
// one run so that ratios between rows mean something on a noisy machine:
// the image's own Python run natively from the unpacked rootfs, a runc
// container from the same image through the same containerd, a cold gVisor
// sandbox, a warm one from the pool, and both of those end to end through
// MCP over stdio. It reports latency percentiles, throughput, CPU time per
// run and the memory of an idle pooled sandbox, as Markdown, JSON and a
// PNG chart.
package bench

import (
	"fmt"
	"strings"
)

// Program is one piece of code every mode runs.
type Program struct {
	Name string `json:"name"`
	// Lang is "python" or "shell".
	Lang string `json:"lang"`
	Code string `json:"code"`
	// Want is the exact stdout a correct run prints.
	Want string `json:"want"`
}

// Programs are the benchmark's programs; compute's loop count is set by
// Calibrate so that it takes about 200 ms natively.
func Programs(computeN int) []Program {
	return []Program{
		{Name: "print", Lang: "python", Code: "print(1)", Want: "1\n"},
		{Name: "numpy", Lang: "python", Code: "import numpy\nprint(numpy.arange(3).sum())", Want: "3\n"},
		{Name: "pandas", Lang: "python", Code: "import pandas as pd\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())", Want: "6\n"},
		{Name: "compute", Lang: "python", Code: computeCode(computeN), Want: computeWant(computeN)},
		{Name: "echo", Lang: "shell", Code: "echo hi", Want: "hi\n"},
	}
}

func computeCode(n int) string {
	return fmt.Sprintf("s = 0\nfor i in range(%d):\n    s += i * i\nprint(s %% 1000003)", n)
}

func computeWant(n int) string {
	s := 0
	for i := 0; i < n; i++ {
		s = (s + i*i%1000003) % 1000003
	}
	return fmt.Sprintf("%d\n", s)
}

// Select picks programs by name ("" or "all" for all).
func Select(all []Program, names string) ([]Program, error) {
	if names == "" || names == "all" {
		return all, nil
	}
	var out []Program
	for _, n := range strings.Split(names, ",") {
		found := false
		for _, p := range all {
			if p.Name == strings.TrimSpace(n) {
				out = append(out, p)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown program %q", n)
		}
	}
	return out, nil
}
