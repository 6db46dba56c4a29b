package tools

import (
	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
)

// countCall records a finished call in the Prometheus metrics, from the
// same record the audit log gets, so the two always agree.
func countCall(rec approval.Record) {
	outcome := rec.Outcome
	switch {
	case rec.Outcome == approval.OutcomeRan && rec.ExitCode == nil:
		// A file operation, not code: it did what it was asked.
		outcome = metrics.OutcomeOK
	case rec.Outcome == approval.OutcomeRan:
		switch {
		case rec.LimitHit == runtime.ReasonTimeout:
			outcome = metrics.OutcomeTimeout
			metrics.LimitViolations.WithLabelValues(metrics.LimitTimeout).Inc()
		case rec.LimitHit == runtime.ReasonOutOfMemory:
			outcome = metrics.OutcomeOOM
			metrics.LimitViolations.WithLabelValues(metrics.LimitMemory).Inc()
		case rec.ExitCode != nil && *rec.ExitCode == 0:
			outcome = metrics.OutcomeOK
		default:
			outcome = metrics.OutcomeFailed
		}
		if rec.Truncated {
			metrics.LimitViolations.WithLabelValues(metrics.LimitOutput).Inc()
		}
		for _, l := range rec.LimitsHit {
			metrics.LimitViolations.WithLabelValues(l).Inc()
		}
		metrics.ExecutionDuration.WithLabelValues(rec.Tool).Observe(float64(rec.DurationMS) / 1000)
	}
	metrics.Executions.WithLabelValues(rec.Tool, outcome).Inc()
	if rec.Decision != "" && rec.Decision != approval.DecisionNone {
		metrics.Approvals.WithLabelValues(rec.Decision).Inc()
	}
}
