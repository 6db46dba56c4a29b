package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Target is one of the goals, checked against this run.
type Target struct {
	Name     string  `json:"name"`
	Goal     string  `json:"goal"`
	Measured string  `json:"measured"`
	Ratio    float64 `json:"ratio,omitempty"`
	Met      bool    `json:"met"`
	// Missing says why it could not be checked (a mode not run).
	Missing string `json:"missing,omitempty"`
}

// find returns the row of mode/program at concurrency c.
func (r *Report) find(mode, program string, c int) *Result {
	for i := range r.Results {
		x := &r.Results[i]
		if x.Mode == mode && x.Program == program && x.Concurrency == c && x.N > 0 {
			return x
		}
	}
	return nil
}

// ratioOf is a target on the ratio of one value (of) of two results: met
// when a's is at most limit times b's.
func ratioOf(of func(*Result) float64, format string) func(name, goal string, limit float64, a, b *Result, what string) Target {
	return func(name, goal string, limit float64, a, b *Result, what string) Target {
		t := Target{Name: name, Goal: goal}
		if a == nil || b == nil || of(a) <= 0 || of(b) <= 0 {
			t.Missing = "a mode or program it compares was not run"
			return t
		}
		t.Ratio = of(a) / of(b)
		t.Measured = fmt.Sprintf(format+" ms / "+format+" ms = %.2f× (%s)", of(a), of(b), t.Ratio, what)
		t.Met = t.Ratio <= limit
		return t
	}
}

// cpuRatio compares CPU per run.
var cpuRatio = ratioOf(func(r *Result) float64 { return r.CPUPerRun }, "%.0f")

func targets(r *Report) []Target {
	ratio := ratioOf(func(r *Result) float64 { return r.P50 }, "%.1f")
	out := []Target{
		ratio("warm end to end vs native", "warm pool through MCP, print(1) p50 ≤ 3× native", 3,
			r.find(ModeMCPWarm, "print", 1), r.find(ModeNative, "print", 1), "mcp-warm ÷ native, print, c=1"),
		// Issue 19's bar: a warm call returns before a local Python would
		// have started.
		ratio("warm call before a local Python", "warm pool through MCP, print(1) p50 ≤ 0.5× native", 0.5,
			r.find(ModeMCPWarm, "print", 1), r.find(ModeNative, "print", 1), "mcp-warm ÷ native, print, c=1"),
		ratio("pandas vs print, warm", "warm pool, pandas + small DataFrame op p50 ≤ 1.5× warm print(1)", 1.5,
			r.find(ModeWarm, "pandas", 1), r.find(ModeWarm, "print", 1), "gvisor-warm pandas ÷ print, c=1"),
		ratio("cold gVisor vs runc", "cold gVisor p50 ≤ 1.5× runc cold", 1.5,
			r.find(ModeCold, "print", 1), r.find(ModeRunc, "print", 1), "gvisor-cold ÷ runc, print, c=1"),
		// Issue 19's: restore instead of boot.
		ratio("cold restored vs runc", "cold sandbox restored from the template, p50 ≤ 1.5× runc cold", 1.5,
			r.find(ModeRestore, "print", 1), r.find(ModeRunc, "print", 1), "gvisor-restore ÷ runc, print, c=1"),
		ratio("pandas in a cold sandbox, restored vs booted", "import pandas in a cold sandbox p50 ≤ 0.5× a booted one's", 0.5,
			r.find(ModeRestore, "pandas", 1), r.find(ModeCold, "pandas", 1), "gvisor-restore ÷ gvisor-cold, pandas, c=1"),
		// A pooled sandbox's refill is a sandbox made with pandas imported:
		// what a cold pandas run costs besides its tiny DataFrame op.
		cpuRatio("refill CPU, restored vs booted", "CPU to make a sandbox with pandas imported (a pool refill) ≤ 1/3 of booting one", 1.0/3,
			r.find(ModeRestore, "pandas", 1), r.find(ModeCold, "pandas", 1), "gvisor-restore ÷ gvisor-cold, CPU per run, pandas, c=1"),
		ratio("paused session resume", "a paused session's next call (restore and print(1)) p50 ≤ 300 ms", 1,
			r.find(ModeResume, "print", 1), &Result{P50: 300}, "session-resume ÷ 300 ms, print, c=1"),
	}
	if r.find(ModeMCPK8sWarm, "print", 1) != nil || r.find(ModeMCPK8sCold, "print", 1) != nil {
		out = append(out,
			ratio("warm pod vs local warm, through MCP", "Kubernetes warm pod through MCP, print(1) p50 ≤ 4× the local warm pool through MCP", 4,
				r.find(ModeMCPK8sWarm, "print", 1), r.find(ModeMCPWarm, "print", 1), "mcp-k8s-warm ÷ mcp-warm, print, c=1"),
			ratio("cold pod vs local cold, through MCP", "Kubernetes cold pod through MCP, print(1) p50 ≤ 3× a local cold sandbox through MCP", 3,
				r.find(ModeMCPK8sCold, "print", 1), r.find(ModeMCPCold, "print", 1), "mcp-k8s-cold ÷ mcp-cold, print, c=1"))
	}
	tp := Target{Name: "throughput at concurrency 4", Goal: "warm pool throughput at c=4 ≥ 80% of cores ÷ CPU per run (refills included)"}
	if x := r.find(ModeWarm, "print", 4); x != nil && x.CPUPerRun > 0 {
		tp.Ratio = x.Efficiency
		tp.Measured = fmt.Sprintf("%.2f runs/s at %.0f ms CPU per run on %d cores: %.0f%% of the CPU-bound %.2f runs/s",
			x.Throughput, x.CPUPerRun, r.Machine.Cores, 100*x.Efficiency, x.Throughput/x.Efficiency)
		tp.Met = x.Efficiency >= 0.8
	} else {
		tp.Missing = "gvisor-warm at concurrency 4 was not run"
	}
	mem := Target{Name: "idle pooled sandbox memory", Goal: "≤ 45 MiB PSS per idle pooled sandbox, 8 idle"}
	if len(r.Memory) > 0 {
		m := r.Memory[0]
		mem.Ratio = m.PerSandboxPSS / 45
		mem.Measured = fmt.Sprintf("%.1f MiB PSS per sandbox with %d idle, preloading %v (shim %.1f, sentry %.1f, gofer %.1f)",
			m.PerSandboxPSS, m.Idle, m.Preload, m.ByKind["shim"], m.ByKind["sentry"], m.ByKind["gofer"])
		mem.Met = m.PerSandboxPSS <= 45 && m.Idle >= 8
	} else {
		mem.Missing = "memory was not measured"
	}
	return append(out, tp, mem)
}

// Cost is what one safe default costs: the same row with the default and
// with the faster, less safe choice.
type Cost struct {
	Name    string `json:"name"`
	Program string `json:"program"`
	// Safe and Fast are the p50 latencies in ms, SafeCPU and FastCPU the
	// CPU per run (refills included).
	Safe    float64 `json:"safe_p50_ms"`
	Fast    float64 `json:"fast_p50_ms"`
	SafeCPU float64 `json:"safe_cpu_ms"`
	FastCPU float64 `json:"fast_cpu_ms"`
}

// costs compares each safety variant that ran with its default, at
// concurrency 1.
func costs(r *Report) []Cost {
	pairs := []struct{ name, safe, fast string }{
		{"runtime monitoring, cold", ModeCold, ModeColdNoMonitor},
		{"runtime monitoring, warm", ModeWarm, ModeWarmNoMonitor},
		{"directfs off, cold", ModeCold, ModeColdDirectFS},
		{"directfs off, warm", ModeWarm, ModeWarmDirectFS},
	}
	var out []Cost
	for _, p := range pairs {
		for _, x := range r.Results {
			if x.Mode != p.safe || x.Concurrency != 1 || x.N == 0 {
				continue
			}
			if f := r.find(p.fast, x.Program, 1); f != nil {
				out = append(out, Cost{Name: p.name, Program: x.Program, Safe: x.P50, Fast: f.P50, SafeCPU: x.CPUPerRun, FastCPU: f.CPUPerRun})
			}
		}
	}
	return out
}

// stepOrder is the order of a run's steps on its path; others follow by
// name.
var stepOrder = []string{"admission", "acquired_sandbox", "exchange", "frame_sent",
	"driver.arrived", "driver.placed", "driver.started", "driver.go_sent", "driver.first_output", "driver.reported", "driver.exited",
	"driver.drained", "driver.collected", "driver.answered", "exit_frame", "attempts",
	"mcp.args", "mcp.approved", "mcp.audit_ready", "mcp.ran", "mcp.result", "mcp.recorded"}

// stepsMarkdown is where a print(1) run's time goes, by mode, at
// concurrency 1: empty when no mode reported its steps.
func (r *Report) stepsMarkdown() string {
	var rows []*Result
	keys := map[string]bool{}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Program == "print" && x.Concurrency == 1 && len(x.Steps) > 0 {
			rows = append(rows, x)
			for k := range x.Steps {
				keys[k] = true
			}
		}
	}
	if len(rows) == 0 {
		return ""
	}
	order := slices.Clone(stepOrder)
	var rest []string
	for k := range keys {
		if !slices.Contains(stepOrder, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	order = append(order, rest...)
	var b strings.Builder
	b.WriteString("\nWhere a `print(1)` run's time goes (p50 ms, concurrency 1; manager steps are durations; `frame_sent`, `driver.*` and `exit_frame` are times since the work was sent, the driver's read on the sandbox's clock, which is the host's; `mcp.*` are times since the server's tool handler began):\n\n| step |")
	for _, x := range rows {
		b.WriteString(" " + x.Mode + " |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(rows)) + "\n")
	for _, k := range order {
		if !keys[k] {
			continue
		}
		b.WriteString("| " + k + " |")
		for _, x := range rows {
			if v, ok := x.Steps[k]; ok {
				fmt.Fprintf(&b, " %.2f", v)
				if n := x.StepsSeen[k]; n > 0 && n < x.N {
					fmt.Fprintf(&b, " (%d of %d runs)", n, x.N)
				}
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	b.WriteString("| **the whole call** |")
	for _, x := range rows {
		fmt.Fprintf(&b, " %.2f |", x.P50)
	}
	b.WriteString("\n")
	return b.String()
}

// Markdown is the report as tables a README can hold.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %d cores (%s), Linux %s, %s; %s; shim %s; %d runs per row (and as many again for throughput); compute loop n=%d.\n\n",
		r.Started.Format("2006-01-02"), r.Machine.Cores, r.Machine.CPU, r.Machine.Kernel, r.Machine.MemTotal, r.Machine.Go, r.Machine.Shim, r.Options.Iterations, r.ComputeN)
	b.WriteString("| mode | program | c | p50 ms | p95 ms | p99 ms | runs/s | CPU ms/run | warm | errors |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %s | %d | %.1f | %.1f | %.1f | %.2f | %.0f | %.0f%% | %d |\n",
			x.Mode, x.Program, x.Concurrency, x.P50, x.P95, x.P99, x.Throughput, x.CPUPerRun, 100*x.WarmFraction, x.Errors)
	}
	for _, m := range r.Memory {
		fmt.Fprintf(&b, "\nIdle pooled sandboxes preloading %v: %d at once, %.1f MiB PSS each (%.1f MiB RSS): shim %.1f, sentry and stubs %.1f, gofer %.1f; %d host processes.\n",
			m.Preload, m.Idle, m.PerSandboxPSS, m.PerSandboxRSS, m.ByKind["shim"], m.ByKind["sentry"], m.ByKind["gofer"], m.Processes)
	}
	if len(r.Costs) > 0 {
		fmt.Fprintf(&b, "\nWhat the safe defaults cost (configured: monitor %v, directfs %v), concurrency 1:\n\n", r.Machine.Monitor, r.Machine.DirectFS)
		b.WriteString("| default | program | p50 ms with | p50 ms without | p50 | CPU ms/run with | without |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range r.Costs {
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %+.0f%% | %.0f | %.0f |\n", c.Name, c.Program, c.Safe, c.Fast, 100*(c.Safe/c.Fast-1), c.SafeCPU, c.FastCPU)
		}
	}
	if len(r.Egress) > 0 {
		b.WriteString(egressMarkdown(r.Egress))
	}
	b.WriteString(r.stepsMarkdown())
	b.WriteString("\n| target | goal | measured | met |\n| --- | --- | --- | --- |\n")
	for _, t := range r.Targets {
		met := "no"
		switch {
		case t.Missing != "":
			met, t.Measured = "—", t.Missing
		case t.Met:
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Name, t.Goal, t.Measured, met)
	}
	for _, x := range r.Results {
		if x.FirstError != "" {
			fmt.Fprintf(&b, "\nFirst error of %s/%s/c=%d: %s\n", x.Mode, x.Program, x.Concurrency, x.FirstError)
		}
	}
	return b.String()
}

// Write saves the report as name.json, name.md and name.png in dir.
func (r *Report) Write(dir, name string) ([]string, error) {
	files, err := writeReport(dir, name, r, r.Markdown())
	if err != nil {
		return nil, err
	}
	png := filepath.Join(dir, name) + ".png"
	if err := r.Chart(png); err != nil {
		return nil, err
	}
	return append(files, png), nil
}

// writeReport saves v as name.json and md as name.md in dir.
func writeReport(dir, name string, v any, md string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	base := filepath.Join(dir, name)
	j, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".json", append(j, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return nil, err
	}
	return []string{base + ".md", base + ".json"}, nil
}
