package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every metric the README names is served from the start, with the label
// values a dashboard selects on, before anything was counted.
func TestHandlerServesEveryMetric(t *testing.T) {
	SetPoolReady(func() map[string]int { return map[string]int{"none": 2} })
	SetCircuitOpen(func() bool { return true })
	Escapes.SetFirewall(func() uint64 { return 7 })
	Escapes.Declare("mount")
	defer func() {
		SetPoolReady(nil)
		SetCircuitOpen(nil)
		Escapes.SetFirewall(nil)
	}()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	for _, want := range []string{
		"# TYPE airlock_executions_total counter",
		"# TYPE airlock_execution_duration_seconds histogram",
		`airlock_sandbox_start_seconds_count{kind="cold"} 0`,
		`airlock_pool_ready{network="none"} 2`,
		`airlock_pool_ready{network="allowlist"} 0`,
		"airlock_sessions_active 0",
		`airlock_resource_limit_violations_total{limit="pids"} 0`,
		`airlock_resource_limit_violations_total{limit="disk"} 0`,
		`airlock_sandbox_escape_attempts_total{kind="firewall_drop"} 7`,
		`airlock_sandbox_escape_attempts_total{kind="sni_mismatch"} 0`,
		`airlock_sandbox_escape_attempts_total{kind="mount"} 0`,
		"airlock_monitor_events_dropped_total 0",
		`airlock_egress_requests_total{decision="deny"} 0`,
		"# TYPE airlock_approvals_total counter",
		"airlock_circuit_open 1",
		"go_goroutines ",
		"process_open_fds ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want the text format", ct)
	}
}
