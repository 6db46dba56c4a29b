package tools

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
)

func TestCountCall(t *testing.T) {
	code := func(n int) *int { return &n }
	cases := []struct {
		name     string
		rec      approval.Record
		outcome  string
		limits   []string
		duration bool
	}{
		{"ok", approval.Record{Tool: "run_python", Outcome: approval.OutcomeRan, ExitCode: code(0), Decision: approval.DecisionAuto}, metrics.OutcomeOK, nil, true},
		{"failed", approval.Record{Tool: "run_shell", Outcome: approval.OutcomeRan, ExitCode: code(3)}, metrics.OutcomeFailed, nil, true},
		{"timeout", approval.Record{Tool: "run_python", Outcome: approval.OutcomeRan, ExitCode: code(137), LimitHit: runtime.ReasonTimeout}, metrics.OutcomeTimeout, []string{metrics.LimitTimeout}, true},
		{"oom", approval.Record{Tool: "run_python", Outcome: approval.OutcomeRan, ExitCode: code(137), LimitHit: runtime.ReasonOutOfMemory}, metrics.OutcomeOOM, []string{metrics.LimitMemory}, true},
		{"flood and full disk", approval.Record{Tool: "run_shell", Outcome: approval.OutcomeRan, ExitCode: code(1), Truncated: true, LimitsHit: []string{metrics.LimitDisk}}, metrics.OutcomeFailed, []string{metrics.LimitOutput, metrics.LimitDisk}, true},
		{"write_file", approval.Record{Tool: "write_file", Outcome: approval.OutcomeRan}, metrics.OutcomeOK, nil, false},
		{"refused", approval.Record{Tool: "run_python", Outcome: approval.OutcomeNotApproved, Decision: approval.DecisionDenied}, approval.OutcomeNotApproved, nil, false},
		{"breaker", approval.Record{Tool: "run_python", Outcome: approval.OutcomeCircuitOpen}, approval.OutcomeCircuitOpen, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			exec := metrics.Executions.WithLabelValues(c.rec.Tool, c.outcome)
			before := testutil.ToFloat64(exec)
			limits := map[string]float64{}
			for _, l := range []string{metrics.LimitTimeout, metrics.LimitMemory, metrics.LimitPids, metrics.LimitOutput, metrics.LimitDisk} {
				limits[l] = testutil.ToFloat64(metrics.LimitViolations.WithLabelValues(l))
			}
			durations := durationCount(t, c.rec.Tool)
			var approvals float64
			if c.rec.Decision != "" {
				approvals = testutil.ToFloat64(metrics.Approvals.WithLabelValues(c.rec.Decision))
			}

			countCall(c.rec)

			if got := testutil.ToFloat64(exec) - before; got != 1 {
				t.Errorf("executions{%s,%s} moved by %v, want 1", c.rec.Tool, c.outcome, got)
			}
			want := map[string]bool{}
			for _, l := range c.limits {
				want[l] = true
			}
			for l, b := range limits {
				moved := testutil.ToFloat64(metrics.LimitViolations.WithLabelValues(l)) - b
				if (moved == 1) != want[l] || moved > 1 {
					t.Errorf("limit %s moved by %v, want hit=%v", l, moved, want[l])
				}
			}
			if got := durationCount(t, c.rec.Tool) - durations; (got == 1) != c.duration {
				t.Errorf("durations observed: %d; want one only for code that ran", got)
			}
			if c.rec.Decision != "" && testutil.ToFloat64(metrics.Approvals.WithLabelValues(c.rec.Decision))-approvals != 1 {
				t.Errorf("approvals{%s} did not move", c.rec.Decision)
			}
		})
	}
}

// durationCount is how many durations of tool's runs were observed.
func durationCount(t *testing.T, tool string) uint64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "airlock_execution_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tool" && l.GetValue() == tool {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
