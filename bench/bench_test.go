package bench

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {95, 95 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}} {
		if got := percentile(lat, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	var r Result
	summarize(&r, []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if r.N != 3 || r.P50 != 2 || r.P99 != 3 || r.Mean != 2 {
		t.Errorf("summary = %+v", r)
	}
}

func TestComputeWantMatchesPython(t *testing.T) {
	// sum(i*i for i in range(10)) = 285
	if got := computeWant(10); got != "285\n" {
		t.Errorf("computeWant(10) = %q", got)
	}
}

func TestTargetsAndReport(t *testing.T) {
	r := &Report{Machine: Machine{Cores: 2}, Options: Options{Iterations: 5}, Results: []Result{
		{Mode: ModeNative, Program: "print", Concurrency: 1, N: 5, P50: 10},
		{Mode: ModeMCPWarm, Program: "print", Concurrency: 1, N: 5, P50: 25},
		{Mode: ModeWarm, Program: "print", Concurrency: 1, N: 5, P50: 20},
		{Mode: ModeWarm, Program: "pandas", Concurrency: 1, N: 5, P50: 40},
		{Mode: ModeWarm, Program: "print", Concurrency: 4, N: 5, P50: 30, Throughput: 3, CPUPerRun: 600, Efficiency: 0.9},
	}, Memory: []Memory{{Preload: []string{"numpy"}, Idle: 8, PerSandboxPSS: 50, ByKind: map[string]float64{}}}}
	ts := targets(r)
	want := map[string]bool{"warm end to end vs native": true, "warm call before a local Python": false, "pandas vs print, warm": false, "throughput at concurrency 4": true, "idle pooled sandbox memory": false}
	for _, tg := range ts {
		if w, ok := want[tg.Name]; ok && tg.Met != w {
			t.Errorf("%s met = %v, want %v (%s)", tg.Name, tg.Met, w, tg.Measured)
		}
		if tg.Name == "cold gVisor vs runc" && tg.Missing == "" {
			t.Error("a target without its modes must say so")
		}
	}
	r.Targets = ts
	md := r.Markdown()
	for _, s := range []string{"| gvisor-warm | pandas | 1 | 40.0 |", "2.50× (mcp-warm ÷ native", "preloading [numpy]"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	files, err := r.Write(t.TempDir(), "x")
	if err != nil || len(files) != 3 || filepath.Ext(files[2]) != ".png" {
		t.Fatalf("Write = %v, %v", files, err)
	}
	fast := &Report{Results: []Result{
		{Mode: ModeMCPWarm, Program: "print", Concurrency: 1, N: 5, P50: 4},
		{Mode: ModeNative, Program: "print", Concurrency: 1, N: 5, P50: 10},
	}}
	for _, tg := range targets(fast) {
		if tg.Name == "warm call before a local Python" && !tg.Met {
			t.Errorf("4 ms through MCP vs 10 ms native: %s not met (%s)", tg.Name, tg.Measured)
		}
	}
}

// Each safety variant that ran is compared with its default at c=1, and a
// variant that did not run gives no row.
func TestCosts(t *testing.T) {
	r := &Report{Machine: Machine{Monitor: true}, Results: []Result{
		{Mode: ModeWarm, Program: "print", Concurrency: 1, N: 5, P50: 33, CPUPerRun: 400},
		{Mode: ModeWarmNoMonitor, Program: "print", Concurrency: 1, N: 5, P50: 30, CPUPerRun: 380},
		{Mode: ModeWarm, Program: "print", Concurrency: 4, N: 5, P50: 90},
		{Mode: ModeWarmNoMonitor, Program: "print", Concurrency: 4, N: 5, P50: 80},
		{Mode: ModeCold, Program: "print", Concurrency: 1, N: 5, P50: 300},
	}}
	r.Costs = costs(r)
	if len(r.Costs) != 1 || r.Costs[0].Name != "runtime monitoring, warm" || r.Costs[0].Safe != 33 || r.Costs[0].Fast != 30 {
		t.Fatalf("costs = %+v", r.Costs)
	}
	if md := r.Markdown(); !strings.Contains(md, "| runtime monitoring, warm | print | 33.0 | 30.0 | +10% | 400 | 380 |") {
		t.Errorf("markdown lacks the cost row:\n%s", md)
	}
}

// The steps table lists each mode's steps in path order, then the rest by
// name, and the whole call.
func TestStepsMarkdown(t *testing.T) {
	r := &Report{Results: []Result{
		{Mode: ModeWarm, Program: "print", Concurrency: 1, N: 3, P50: 18, Steps: map[string]float64{"exchange": 15, "admission": 0.01, "zzz": 1}},
		{Mode: ModeWarm, Program: "compute", Concurrency: 1, N: 3, P50: 200, Steps: map[string]float64{"exchange": 190}},
	}}
	md := r.stepsMarkdown()
	for _, want := range []string{"| step | gvisor-warm |", "| admission | 0.01 |", "| exchange | 15.00 |", "| zzz | 1.00 |", "| **the whole call** | 18.00 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("steps table lacks %q:\n%s", want, md)
		}
	}
	if strings.Index(md, "admission") > strings.Index(md, "exchange") || strings.Index(md, "exchange") > strings.Index(md, "zzz") {
		t.Errorf("steps out of order:\n%s", md)
	}
	if (&Report{}).stepsMarkdown() != "" {
		t.Error("a report without steps has a steps table")
	}
}

// The server's "call steps" lines are found among its other log lines,
// whatever the write boundaries, and a run's steps are waited for.
func TestCallSteps(t *testing.T) {
	c := newCallSteps()
	lines := `{"time":"x","level":"INFO","msg":"started"}
{"time":"x","level":"DEBUG","msg":"call steps","run":"r1","tool":"run_python","args":0.05,"ran":8.5,"recorded":9.1}
not json
`
	for i := 0; i < len(lines); i += 7 {
		_, _ = c.Write([]byte(lines[i:min(i+7, len(lines))]))
	}
	got := c.take("r1", time.Second)
	if got["mcp.args"] != 0.05 || got["mcp.ran"] != 8.5 || got["mcp.recorded"] != 9.1 || len(got) != 3 {
		t.Fatalf("steps of r1 = %v", got)
	}
	if c.take("r1", 0) != nil {
		t.Error("a run's steps were taken twice")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = c.Write([]byte(`{"msg":"call steps","run":"r2","ran":1}` + "\n"))
	}()
	if got := c.take("r2", 5*time.Second); got["mcp.ran"] != 1 {
		t.Errorf("steps of r2, written after the take began = %v", got)
	}
}

// The egress rows come from the real proxy on loopback: every path
// answers, and interception is measured, not assumed.
func TestMeasureEgress(t *testing.T) {
	rows, err := MeasureEgress(t.Context(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want direct, tunnelled and intercepted, each new and kept alive", len(rows))
	}
	for _, r := range rows {
		if r.N != 5 || r.P50 <= 0 || r.P95 < r.P50 {
			t.Errorf("row %+v", r)
		}
	}
	md := (&Report{Egress: rows}).Markdown()
	if !strings.Contains(md, "| intercepted | kept alive | 5 |") {
		t.Errorf("report:\n%s", md)
	}
}
