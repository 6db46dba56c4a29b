package doctor

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
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

// The doctor names the host's LSM and whether a profile confines runsc.
func TestLSMReport(t *testing.T) {
	write := func(root, p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	none, aa, aaBare, se := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	write(aa, "sys/kernel/security/lsm", "lockdown,capability,apparmor\n")
	write(aa, "sys/kernel/security/apparmor/profiles", "docker-default (enforce)\nrunsc (enforce)\n")
	write(aaBare, "sys/module/apparmor/parameters/enabled", "Y\n")
	write(aaBare, "sys/kernel/security/apparmor/profiles", "docker-default (enforce)\n")
	write(se, "sys/kernel/security/lsm", "capability,selinux")
	write(se, "sys/fs/selinux/enforce", "1")
	for _, c := range []struct {
		root, want string
	}{
		{none, "no AppArmor or SELinux (active: none)"},
		{aa, "apparmor: profiles runsc (enforce)"},
		{aaBare, "no profile names runsc or a containerd shim"},
		{se, "selinux: enforcing"},
	} {
		got := lsmCheck(c.root)
		if !got.OK || !strings.Contains(got.Detail, c.want) {
			t.Errorf("%s: %+v, want OK with %q", c.root, got, c.want)
		}
	}
}
