package bench

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
)

// Result is one row: a mode running a program at a concurrency.
type Result struct {
	Mode        string `json:"mode"`
	Program     string `json:"program"`
	Concurrency int    `json:"concurrency"`
	// Latency over the samples, in milliseconds.
	N      int     `json:"n"`
	P50    float64 `json:"p50_ms"`
	P95    float64 `json:"p95_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
	Errors int     `json:"errors"`
	// FirstError is the first failure, if any run failed.
	FirstError string `json:"first_error,omitempty"`
	// WarmFraction is the share of runs that got a warm sandbox.
	WarmFraction float64 `json:"warm_fraction"`
	// Throughput is runs per second with Concurrency workers running back
	// to back; CPUPerRun is the whole machine's CPU time per run over that
	// phase, pool refills included (milliseconds).
	Throughput float64 `json:"throughput_per_s"`
	CPUPerRun  float64 `json:"cpu_per_run_ms"`
	// Efficiency is Throughput over the CPU-bound limit (cores ÷ CPU per
	// run): how close the parallelism comes to what the CPU allows.
	Efficiency float64 `json:"efficiency"`
	// Steps are the p50 of each step of the runs' path (runtime
	// Result.Timings: durations of the manager's steps, the driver's as
	// times since it got the work), where the mode reports them.
	Steps map[string]float64 `json:"steps_p50_ms,omitempty"`
	// StepsSeen is in how many of the N runs each step was reported.
	StepsSeen map[string]int `json:"steps_seen,omitempty"`
}

// summarizeSteps sets r.Steps to the median of each step over the runs.
func summarizeSteps(r *Result, steps map[string][]float64) {
	if len(steps) == 0 {
		return
	}
	r.Steps, r.StepsSeen = map[string]float64{}, map[string]int{}
	for k, v := range steps {
		sort.Float64s(v)
		r.Steps[k], r.StepsSeen[k] = v[(len(v)-1)/2], len(v)
	}
}

// summarize fills the latency fields of r from samples.
func summarize(r *Result, lat []time.Duration) {
	r.N = len(lat)
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	r.P50 = runtime.Millis(percentile(lat, 50))
	r.P95 = runtime.Millis(percentile(lat, 95))
	r.P99 = runtime.Millis(percentile(lat, 99))
	r.Mean = runtime.Millis(sum / time.Duration(len(lat)))
}

// percentile is the nearest-rank percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// cpuTicks is the machine's busy CPU time so far, from /proc/stat, in
// clock ticks (USER_HZ, 100 per second on Linux).
func cpuTicks() (int64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, fmt.Errorf("empty /proc/stat")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, fmt.Errorf("unexpected /proc/stat: %q", sc.Text())
	}
	var busy int64
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, err
		}
		busy += v
	}
	return busy, nil
}

const ticksPerSecond = 100
