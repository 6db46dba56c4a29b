package monitor

import (
	"encoding/binary"
	"testing"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

func ctx(id string) *pb.ContextData { return &pb.ContextData{ContainerId: id} }

func exit(errno int64) *pb.Exit {
	if errno == 0 {
		return &pb.Exit{Result: 0}
	}
	return &pb.Exit{Result: -errno, Errorno: errno}
}

func sockaddr4(ip [4]byte, port uint16) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint16(b[0:2], afINET)
	binary.BigEndian.PutUint16(b[2:4], port)
	copy(b[4:8], ip[:])
	return b
}

func sockaddr6(ip [16]byte, port uint16) []byte {
	b := make([]byte, 28)
	binary.LittleEndian.PutUint16(b[0:2], afINET6)
	binary.BigEndian.PutUint16(b[2:4], port)
	copy(b[8:24], ip[:])
	return b
}

type classifyCase struct {
	name    string
	mt      pb.MessageType
	msg     proto.Message
	kind    Kind // "" means: not an attempt
	syscall string
}

// amd64Cases uses amd64 syscall numbers; it is run against the amd64 table
// whatever the host architecture.
var amd64Cases = []classifyCase{
	// mount
	{"mount", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 165}, KindMount, "mount"},
	{"umount2", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 166}, KindMount, "umount2"},
	{"pivot_root", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 155}, KindMount, "pivot_root"},
	{"mount exit not double counted", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 165, Exit: exit(errEPERM)}, "", ""},
	{"raw read is nothing", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 0}, "", ""},
	{"raw under another type", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Syscall{Sysno: 165}, "", ""},
	// namespace
	{"unshare", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 272, Arg1: 0x10000000}, KindNamespace, "unshare"},
	{"setns", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 308}, KindNamespace, "setns"},
	{"clone newuser", pb.MessageType_MESSAGE_SYSCALL_CLONE, &pb.Clone{Sysno: 56, Flags: 0x10000000 | 17}, KindNamespace, "clone"},
	{"clone newnet", pb.MessageType_MESSAGE_SYSCALL_CLONE, &pb.Clone{Sysno: 56, Flags: 0x40000000}, KindNamespace, "clone"},
	{"clone fork-like (benign)", pb.MessageType_MESSAGE_SYSCALL_CLONE, &pb.Clone{Sysno: 56, Flags: 0x01200011}, "", ""},
	{"clone thread (benign)", pb.MessageType_MESSAGE_SYSCALL_CLONE, &pb.Clone{Sysno: 56, Flags: 0x003d0f00}, "", ""},
	// module
	{"init_module", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 175}, KindModule, "init_module"},
	{"finit_module", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 313}, KindModule, "finit_module"},
	{"delete_module", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 176}, KindModule, "delete_module"},
	{"kexec_load", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 246}, KindModule, "kexec_load"},
	{"kexec_file_load", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 320}, KindModule, "kexec_file_load"},
	// ptrace
	{"ptrace traceme", pb.MessageType_MESSAGE_SYSCALL_PTRACE, &pb.Ptrace{Sysno: 101, Request: 0}, KindPtrace, "ptrace"},
	{"ptrace attach", pb.MessageType_MESSAGE_SYSCALL_PTRACE, &pb.Ptrace{Sysno: 101, Request: 16, Pid: 7}, KindPtrace, "ptrace"},
	// privilege
	{"setuid(0) refused", pb.MessageType_MESSAGE_SYSCALL_SETID, &pb.Setid{Sysno: 105, Id: 0, Exit: exit(errEPERM)}, KindPrivilege, "setuid"},
	{"setgid(0) refused", pb.MessageType_MESSAGE_SYSCALL_SETID, &pb.Setid{Sysno: 106, Exit: exit(errEPERM)}, KindPrivilege, "setgid"},
	{"setuid succeeded (benign)", pb.MessageType_MESSAGE_SYSCALL_SETID, &pb.Setid{Sysno: 105, Id: 1000, Exit: exit(0)}, "", ""},
	{"setsid EPERM (benign, same message)", pb.MessageType_MESSAGE_SYSCALL_SETID, &pb.Setid{Sysno: 112, Exit: exit(errEPERM)}, "", ""},
	{"setresuid refused", pb.MessageType_MESSAGE_SYSCALL_SETRESID, &pb.Setresid{Sysno: 117, Exit: exit(errEPERM)}, KindPrivilege, "setresuid"},
	{"setresgid refused", pb.MessageType_MESSAGE_SYSCALL_SETRESID, &pb.Setresid{Sysno: 119, Rid: 0xffffffff, Exit: exit(errEPERM)}, KindPrivilege, "setresgid"},
	{"setresuid succeeded (benign)", pb.MessageType_MESSAGE_SYSCALL_SETRESID, &pb.Setresid{Sysno: 117, Exit: exit(0)}, "", ""},
	{"setreuid refused (raw exit)", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 113, Exit: exit(errEPERM)}, KindPrivilege, "setreuid"},
	{"setregid refused (raw exit)", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 114, Exit: exit(errEPERM)}, KindPrivilege, "setregid"},
	{"setreuid succeeded (benign)", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 113, Exit: exit(0)}, "", ""},
	{"setreuid enter (no verdict yet)", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 113}, "", ""},
	{"chroot", pb.MessageType_MESSAGE_SYSCALL_CHROOT, &pb.Chroot{Sysno: 161, Pathname: "/tmp/x"}, KindPrivilege, "chroot"},
	// kernel
	{"bpf", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 321}, KindKernel, "bpf"},
	{"keyctl", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 250}, KindKernel, "keyctl"},
	{"add_key", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 248}, KindKernel, "add_key"},
	{"request_key", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 249}, KindKernel, "request_key"},
	{"perf_event_open", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 298}, KindKernel, "perf_event_open"},
	{"userfaultfd", pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 323}, KindKernel, "userfaultfd"},
	// readonly_write
	{"openat /usr O_WRONLY|O_CREAT EROFS", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/usr/bin/x", Flags: oWRONLY | oCREAT, Exit: exit(errEROFS)}, KindReadonlyWrite, "openat"},
	{"open O_RDWR EACCES", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 2, Pathname: "/etc/passwd", Flags: oRDWR, Exit: exit(errEACCES)}, KindReadonlyWrite, "open"},
	{"creat EROFS", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 85, Pathname: "/bin/sh", Flags: oWRONLY | oCREAT | oTRUNC, Exit: exit(errEROFS)}, KindReadonlyWrite, "creat"},
	{"O_TRUNC alone EROFS", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/etc/hosts", Flags: oTRUNC, Exit: exit(errEROFS)}, KindReadonlyWrite, "openat"},
	{"read refused EACCES (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/proc/1/mem", Flags: 0, Exit: exit(errEACCES)}, "", ""},
	{"write succeeded (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/workspace/a", Flags: oWRONLY | oCREAT, Exit: exit(0)}, "", ""},
	{"write ENOENT (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/nope/a", Flags: oWRONLY | oCREAT, Exit: &pb.Exit{Result: -2, Errorno: 2}}, "", ""},
	{".pyc write EROFS (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/usr/lib/python3.12/__pycache__/os.cpython-312.pyc", Flags: oWRONLY | oCREAT | oTRUNC, Exit: exit(errEROFS)}, "", ""},
	{".pyc temp file EROFS (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "/usr/lib/python3.12/__pycache__/os.cpython-312.pyc.140234", Flags: oWRONLY | oCREAT | 0x80, Exit: exit(errEROFS)}, "", ""},
	{"relative __pycache__ EACCES (benign)", pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{Sysno: 257, Pathname: "__pycache__/m.cpython-312.pyc.1", Flags: oWRONLY | oCREAT, Exit: exit(errEACCES)}, "", ""},
	// raw_socket
	{"socket AF_INET SOCK_RAW", pb.MessageType_MESSAGE_SYSCALL_SOCKET, &pb.Socket{Sysno: 41, Domain: afINET, Type: sockRAW, Protocol: 1}, KindRawSocket, "socket"},
	{"socket SOCK_RAW|SOCK_CLOEXEC", pb.MessageType_MESSAGE_SYSCALL_SOCKET, &pb.Socket{Sysno: 41, Domain: afINET6, Type: sockRAW | 0x80000}, KindRawSocket, "socket"},
	{"socket AF_PACKET SOCK_DGRAM", pb.MessageType_MESSAGE_SYSCALL_SOCKET, &pb.Socket{Sysno: 41, Domain: afPACKET, Type: 2}, KindRawSocket, "socket"},
	{"socket AF_INET SOCK_STREAM (benign)", pb.MessageType_MESSAGE_SYSCALL_SOCKET, &pb.Socket{Sysno: 41, Domain: afINET, Type: 1 | 0x800}, "", ""},
	{"socket AF_UNIX SOCK_DGRAM (benign)", pb.MessageType_MESSAGE_SYSCALL_SOCKET, &pb.Socket{Sysno: 41, Domain: 1, Type: 2}, "", ""},
	// connect_blocked
	{"connect v4 ENETUNREACH", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{1, 1, 1, 1}, 443), Exit: exit(errENETUNREACH)}, KindConnectBlocked, "connect"},
	{"connect v4 ECONNREFUSED", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{10, 0, 0, 1}, 22), Exit: exit(errECONNREFUSED)}, KindConnectBlocked, "connect"},
	{"connect v4 EPERM", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{169, 254, 169, 254}, 80), Exit: exit(errEPERM)}, KindConnectBlocked, "connect"},
	{"connect v6 EACCES", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr6([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 1}, 443), Exit: exit(errEACCES)}, KindConnectBlocked, "connect"},
	{"connect succeeded (benign)", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{10, 0, 0, 1}, 3128), Exit: exit(0)}, "", ""},
	{"connect EINPROGRESS (benign)", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{1, 1, 1, 1}, 443), Exit: &pb.Exit{Result: -115, Errorno: 115}}, "", ""},
	{"connect loopback refused (benign)", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr4([4]byte{127, 0, 0, 1}, 8080), Exit: exit(errECONNREFUSED)}, "", ""},
	{"connect v4-mapped loopback (benign)", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: sockaddr6([16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}, 80), Exit: exit(errECONNREFUSED)}, "", ""},
	{"connect AF_UNIX refused (benign)", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: []byte{1, 0, '/', 'x'}, Exit: exit(errECONNREFUSED)}, "", ""},
	{"connect short address", pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{Sysno: 42, Address: []byte{2, 0, 0}, Exit: exit(errENETUNREACH)}, "", ""},
	// other types
	{"nil message", pb.MessageType_MESSAGE_SYSCALL_RAW, nil, "", ""},
	{"task exit", pb.MessageType_MESSAGE_SENTRY_TASK_EXIT, &pb.TaskExit{}, "", ""},
}

func TestClassifyAMD64(t *testing.T) {
	seen := map[Kind]bool{}
	for _, tc := range amd64Cases {
		t.Run(tc.name, func(t *testing.T) {
			kind, sc, detail, ok := classifyArch(archTables["amd64"], tc.mt, tc.msg)
			if ok != (tc.kind != "") || kind != tc.kind || sc != tc.syscall {
				t.Fatalf("got (%q, %q, %q, %v), want (%q, %q)", kind, sc, detail, ok, tc.kind, tc.syscall)
			}
			if len(detail) > maxDetail {
				t.Fatalf("detail is %d bytes", len(detail))
			}
			seen[kind] = true
		})
	}
	for _, k := range Kinds() {
		if !seen[k] {
			t.Errorf("no case covers kind %q", k)
		}
	}
}

func TestClassifyARM64Numbers(t *testing.T) {
	arm := archTables["arm64"]
	for sysno, want := range map[uint64]Kind{40: KindMount, 97: KindNamespace, 273: KindModule, 280: KindKernel} {
		if k, _, _, ok := classifyArch(arm, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: sysno}); !ok || k != want {
			t.Errorf("arm64 sysno %d: got %q %v, want %q", sysno, k, ok, want)
		}
	}
	// 165 is mount on amd64 only; on arm64 it is getrusage.
	if _, _, _, ok := classifyArch(arm, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{Sysno: 165}); ok {
		t.Error("arm64 sysno 165 classified")
	}
	if k, sc, _, ok := classifyArch(arm, pb.MessageType_MESSAGE_SYSCALL_SETID, &pb.Setid{Sysno: 146, Exit: exit(errEPERM)}); !ok || k != KindPrivilege || sc != "setuid" {
		t.Errorf("arm64 setuid: %q %q %v", k, sc, ok)
	}
}

func TestSanitize(t *testing.T) {
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'a'
	}
	for in, want := range map[string]string{
		"/usr/bin/x":       "/usr/bin/x",
		"a\nb\x1b[31m":     "a?b?[31m",
		"bad\xffutf8":      "bad?utf8",
		string(long[:300]): string(long[:maxDetail]),
		string(long):       string(long[:maxDetail]),
	} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}
