package doctor

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/airlock-mcp/airlock/config"
)

func TestMissingPartsAreReportedWithTheirFix(t *testing.T) {
	cfg := config.Defaults()
	cfg.StateDir = t.TempDir()
	cfg.Containerd.Binary = "no-such-containerd"
	cfg.Runtime.Runsc = "no-such-runsc"
	var out bytes.Buffer
	if Run(context.Background(), cfg, &out, slog.Default()) {
		t.Fatal("doctor passed a host without containerd or runsc")
	}
	report := out.String()
	for _, want := range []string{
		"FAIL containerd   no-such-containerd not found on PATH",
		"FAIL runsc        no-such-runsc not found on PATH",
		"fix: run scripts/install-deps.sh",
		"sandbox      not tried",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
}

func TestDynamicRunscIsRejected(t *testing.T) {
	// /bin/ls is dynamically linked on Debian: the check must say so.
	dyn, err := isDynamic("/bin/ls")
	if err != nil || !dyn {
		t.Fatalf("isDynamic(/bin/ls) = %v, %v", dyn, err)
	}
}
