package doctor

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
)

// lsmCheck reports the host's Linux security modules and whether an
// AppArmor or SELinux policy confines runsc and the shims. It never fails
// the doctor: gVisor's sentry is confined by its own seccomp filter and
// namespaces (and, with directfs off, a user namespace) either way; an LSM
// is one more layer an operator may want to know about. root is "/" but
// for tests.
func lsmCheck(root string) Check {
	read := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(root, p))
		return strings.TrimSpace(string(b))
	}
	var lsms []string
	if l := read("sys/kernel/security/lsm"); l != "" {
		lsms = strings.Split(l, ",")
	} else {
		// securityfs not mounted: the modules' own files still say.
		if read("sys/module/apparmor/parameters/enabled") == "Y" {
			lsms = append(lsms, "apparmor")
		}
		if _, err := os.Stat(filepath.Join(root, "sys/fs/selinux/enforce")); err == nil {
			lsms = append(lsms, "selinux")
		}
	}
	var parts []string
	for _, m := range lsms {
		switch m {
		case "apparmor":
			parts = append(parts, "apparmor: "+apparmorConfinement(filepath.Join(root, "sys/kernel/security/apparmor/profiles")))
		case "selinux":
			mode := "permissive"
			if read("sys/fs/selinux/enforce") == "1" {
				mode = "enforcing"
			}
			parts = append(parts, "selinux: "+mode+" (runsc and the shims run in the type containerd gives them)")
		}
	}
	if len(parts) == 0 {
		active := "none"
		if len(lsms) > 0 {
			active = strings.Join(lsms, ",")
		}
		return Check{Name: "lsm", OK: true, Detail: "no AppArmor or SELinux (active: " + active + "): runsc and the shims run unconfined by an LSM; gVisor's seccomp filter and namespaces confine the sentry"}
	}
	return Check{Name: "lsm", OK: true, Detail: strings.Join(parts, "; ")}
}

// apparmorConfinement says which loaded AppArmor profiles name runsc or a
// containerd shim, and in which mode.
func apparmorConfinement(profiles string) string {
	f, err := os.Open(profiles)
	if err != nil {
		return "on; its profiles are not readable here"
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text() // "name (mode)"
		name, _, _ := strings.Cut(line, " ")
		if strings.Contains(name, "runsc") || strings.Contains(name, "containerd-shim") {
			found = append(found, line)
		}
	}
	if len(found) == 0 {
		return "on; no profile names runsc or a containerd shim, so they run unconfined by it"
	}
	return "profiles " + strings.Join(found, ", ")
}
