package monitor

import "runtime"

// rawKind is a syscall watched through gVisor's raw "syscall/sysno/N/..."
// points, which exist for every syscall number from 0 to 441 on both
// architectures, implemented or not (pkg/sentry/seccheck/metadata_amd64.go
// and metadata_arm64.go, addRawSyscallPoint loop).
type rawKind struct {
	name string
	kind Kind
	// exit: watch the exit point and report only a refusal (EPERM);
	// otherwise watch the enter point and report every call, whatever its
	// outcome, because the attempt itself is the signal.
	exit bool
}

// archTable holds what differs between architectures: syscall numbers and
// which named points exist.
type archTable struct {
	raw map[uint64]rawKind
	// named syscall points, as "syscall/<name>/<enter|exit>".
	named []string
	// setid maps the sysno of the named setuid/setgid/setresuid/setresgid
	// points to a name: the Setid message is shared with setsid(2), which
	// must not count as a privilege change.
	setid map[uint64]string
}

// Numbers from gVisor's pkg/sentry/syscalls/linux/linux64.go (AMD64 and ARM64
// tables) at the pinned version.
var archTables = map[string]*archTable{
	"amd64": {
		raw: map[uint64]rawKind{
			165: {"mount", KindMount, false},
			166: {"umount2", KindMount, false},
			155: {"pivot_root", KindMount, false},
			272: {"unshare", KindNamespace, false},
			308: {"setns", KindNamespace, false},
			175: {"init_module", KindModule, false},
			313: {"finit_module", KindModule, false},
			176: {"delete_module", KindModule, false},
			246: {"kexec_load", KindModule, false},
			320: {"kexec_file_load", KindModule, false},
			321: {"bpf", KindKernel, false},
			250: {"keyctl", KindKernel, false},
			248: {"add_key", KindKernel, false},
			249: {"request_key", KindKernel, false},
			298: {"perf_event_open", KindKernel, false},
			323: {"userfaultfd", KindKernel, false},
			// No named points exist for these two (only setuid, setgid,
			// setresuid, setresgid have one), so their raw exit carries
			// the errno instead.
			113: {"setreuid", KindPrivilege, true},
			114: {"setregid", KindPrivilege, true},
		},
		named: []string{
			"syscall/ptrace/enter",
			"syscall/chroot/enter",
			"syscall/clone/enter",
			"syscall/socket/enter",
			"syscall/setuid/exit",
			"syscall/setgid/exit",
			"syscall/setresuid/exit",
			"syscall/setresgid/exit",
			"syscall/connect/exit",
			"syscall/open/exit",
			"syscall/openat/exit",
			"syscall/creat/exit",
		},
		setid: map[uint64]string{105: "setuid", 106: "setgid", 117: "setresuid", 119: "setresgid"},
	},
	"arm64": {
		raw: map[uint64]rawKind{
			40:  {"mount", KindMount, false},
			39:  {"umount2", KindMount, false},
			41:  {"pivot_root", KindMount, false},
			97:  {"unshare", KindNamespace, false},
			268: {"setns", KindNamespace, false},
			105: {"init_module", KindModule, false},
			273: {"finit_module", KindModule, false},
			106: {"delete_module", KindModule, false},
			104: {"kexec_load", KindModule, false},
			294: {"kexec_file_load", KindModule, false},
			280: {"bpf", KindKernel, false},
			219: {"keyctl", KindKernel, false},
			217: {"add_key", KindKernel, false},
			218: {"request_key", KindKernel, false},
			241: {"perf_event_open", KindKernel, false},
			282: {"userfaultfd", KindKernel, false},
			145: {"setreuid", KindPrivilege, true},
			143: {"setregid", KindPrivilege, true},
		},
		// arm64 has no open(2) or creat(2): openat covers both.
		named: []string{
			"syscall/ptrace/enter",
			"syscall/chroot/enter",
			"syscall/clone/enter",
			"syscall/socket/enter",
			"syscall/setuid/exit",
			"syscall/setgid/exit",
			"syscall/setresuid/exit",
			"syscall/setresgid/exit",
			"syscall/connect/exit",
			"syscall/openat/exit",
		},
		setid: map[uint64]string{146: "setuid", 144: "setgid", 147: "setresuid", 149: "setresgid"},
	},
}

// hostArch is the table for the architecture airlock runs on, which is the
// sandbox's (runsc does not emulate another architecture). nil on an
// unsupported architecture.
var hostArch = archTables[runtime.GOARCH]
