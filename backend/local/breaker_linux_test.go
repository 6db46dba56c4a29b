package local_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
)

// TestBreakerOpensAndCloses makes sandbox creation fail for real (runsc
// replaced by a script that exits 1), sees the breaker open and refuse at
// once without touching containerd, mends runsc, and sees the probe after
// the cooldown close it. A user-code failure in between counts for nothing.
func TestBreakerOpensAndCloses(t *testing.T) {
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	o := managerOptions(t, s, slog.LevelError)
	realRunsc := o.Runsc
	// A state dir of its own: the runsc wrapper written there must not
	// replace the test stack's.
	dir := t.TempDir()
	fake := filepath.Join(dir, "runsc")
	setRunsc := func(body string) {
		t.Helper()
		tmp := fake + ".tmp"
		if err := os.WriteFile(tmp, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, fake); err != nil {
			t.Fatal(err)
		}
	}
	setRunsc(`echo "runsc broken by the test" >&2; exit 1`)
	o.StateDir, o.Runsc = dir, fake
	o.Concurrency, o.Queue, o.PoolSize = 2, 0, 0
	o.Breaker = runtime.BreakerOptions{Failures: 3, Window: time.Minute, Cooldown: 2 * time.Second}
	m := startManager(t, s, ctx, o)
	metrics.SetCircuitOpen(m.Breaker().Open)
	defer metrics.SetCircuitOpen(s.Manager.Breaker().Open)

	req := func(code string) runtime.Request {
		return runtime.Request{Language: runtime.Python, Code: code, Limits: limits()}
	}
	for i := 1; i <= 3; i++ {
		_, err := m.Run(context.Background(), req("print(1)"))
		var ie *runtime.InfraError
		if !errors.As(err, &ie) {
			t.Fatalf("run %d with a broken runsc: err = %v, want an InfraError", i, err)
		}
	}
	m.WaitTeardowns()
	if !m.Breaker().Open() || circuitGauge(t) != 1 {
		t.Fatalf("after 3 creation failures: breaker open %v, airlock_circuit_open %v; want open, 1", m.Breaker().Open(), circuitGauge(t))
	}
	before := countContainers(t, s)
	_, err := m.Run(context.Background(), req("print(1)"))
	var co *runtime.CircuitOpenError
	if !errors.As(err, &co) || !strings.Contains(co.Reason, "create sandbox task") {
		t.Fatalf("run with the breaker open: err = %v; want a CircuitOpenError naming the last failure", err)
	}
	if after := countContainers(t, s); after != before {
		t.Fatalf("containers %d -> %d: an open breaker still created a sandbox", before, after)
	}

	setRunsc("exec " + shellQuote(realRunsc) + ` "$@"`)
	time.Sleep(2100 * time.Millisecond) // the cooldown
	res, err := m.Run(context.Background(), req("raise SystemExit(7)"))
	if err != nil || res.ExitCode != 7 {
		t.Fatalf("probe after mending runsc: exit %d, err %v; want exit 7 (user code failing)", res.ExitCode, err)
	}
	if m.Breaker().Open() || circuitGauge(t) != 0 {
		t.Fatal("a successful probe did not close the breaker")
	}
	// User-code failures never count: many in a row leave it closed.
	for i := 0; i < 4; i++ {
		if res, err := m.Run(context.Background(), req("raise SystemExit(1)")); err != nil || res.ExitCode != 1 {
			t.Fatalf("failing user code: exit %d, err %v", res.ExitCode, err)
		}
	}
	if m.Breaker().Open() {
		t.Fatal("user-code failures opened the breaker")
	}
	m.WaitTeardowns()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// circuitGauge reads airlock_circuit_open from the metrics registry.
func circuitGauge(t *testing.T) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "airlock_circuit_open" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("airlock_circuit_open not exported")
	return 0
}

// countContainers is how many containers the test namespace holds.
func countContainers(t *testing.T, s *boot.Stack) int {
	t.Helper()
	cs, err := s.Client.Containers(namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}
