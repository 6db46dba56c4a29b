package monitor

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// Linux ABI values (identical on amd64 and arm64). They are spelt out rather
// than taken from x/sys/unix because the classifier is pure and builds on
// every OS, while the events always come from a Linux sandbox.
const (
	errEPERM        = 1
	errEACCES       = 13
	errEROFS        = 30
	errENETUNREACH  = 101
	errECONNREFUSED = 111

	oWRONLY = 0x1
	oRDWR   = 0x2
	oCREAT  = 0x40
	oTRUNC  = 0x200

	afINET   = 2
	afINET6  = 10
	afPACKET = 17

	sockRAW    = 3
	sockPACKET = 10
	// sockTypeMask strips SOCK_NONBLOCK and SOCK_CLOEXEC from socket's type.
	sockTypeMask = 0xf

	// cloneNewFlags is every CLONE_NEW* flag valid for clone(2): NEWNS,
	// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET. (CLONE_NEWTIME,
	// 0x80, exists only for clone3; in clone(2) the low byte is the exit
	// signal.)
	cloneNewFlags = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 |
		0x10000000 | 0x20000000 | 0x40000000
)

var errnoNames = map[int64]string{
	errEPERM: "EPERM", errEACCES: "EACCES", errEROFS: "EROFS",
	errENETUNREACH: "ENETUNREACH", errECONNREFUSED: "ECONNREFUSED",
}

func errnoName(e int64) string {
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return "errno " + strconv.FormatInt(e, 10)
}

// Classify decides whether a decoded trace point is an escape attempt. mt is
// the header's message type and msg the payload decoded by [ParseMessage].
// It returns the attempt's kind, the syscall name, a short sanitised detail,
// and ok=false for everything that is not an attempt (most events: the
// open/openat points fire on every file open). It is a pure function of its
// arguments and the host architecture.
func Classify(mt pb.MessageType, msg proto.Message) (kind Kind, syscall, detail string, ok bool) {
	if hostArch == nil {
		return "", "", "", false
	}
	return classifyArch(hostArch, mt, msg)
}

func classifyArch(t *archTable, mt pb.MessageType, msg proto.Message) (Kind, string, string, bool) {
	var (
		kind         Kind
		name, detail string
		ok           bool
	)
	switch m := msg.(type) {
	case *pb.Syscall:
		if mt == pb.MessageType_MESSAGE_SYSCALL_RAW {
			kind, name, detail, ok = classifyRaw(t, m)
		}
	case *pb.Ptrace:
		// Any request: the sandboxed code has no debugger, and TRACEME is
		// the first half of the classic attach-to-a-sibling trick.
		kind, name, ok = KindPtrace, "ptrace", true
		detail = fmt.Sprintf("request=%d pid=%d", m.GetRequest(), m.GetPid())
	case *pb.Chroot:
		// Any chroot: runsc's own chroot happens outside the sentry, so
		// whatever reaches this point came from the sandboxed code.
		kind, name, ok = KindPrivilege, "chroot", true
		detail = m.GetPathname()
	case *pb.Setid:
		// Only a refused change: dropping privileges, or a no-op change to
		// the current id, succeeds and is ordinary.
		if n, known := t.setid[m.GetSysno()]; known && m.GetExit().GetErrorno() == errEPERM {
			kind, name, ok = KindPrivilege, n, true
			detail = fmt.Sprintf("id=%d", int32(m.GetId()))
		}
	case *pb.Setresid:
		if n, known := t.setid[m.GetSysno()]; known && m.GetExit().GetErrorno() == errEPERM {
			kind, name, ok = KindPrivilege, n, true
			detail = fmt.Sprintf("r=%d e=%d s=%d", int32(m.GetRid()), int32(m.GetEid()), int32(m.GetSid()))
		}
	case *pb.Clone:
		if m.GetFlags()&cloneNewFlags != 0 {
			kind, name, ok = KindNamespace, "clone", true
			detail = fmt.Sprintf("flags=%#x", m.GetFlags())
		}
	case *pb.Socket:
		typ := m.GetType() & sockTypeMask
		if typ == sockRAW || typ == sockPACKET || m.GetDomain() == afPACKET {
			kind, name, ok = KindRawSocket, "socket", true
			detail = fmt.Sprintf("domain=%d type=%d protocol=%d", m.GetDomain(), m.GetType(), m.GetProtocol())
		}
	case *pb.Open:
		kind, name, detail, ok = classifyOpen(t, m)
	case *pb.Connect:
		kind, name, detail, ok = classifyConnect(m)
	}
	if !ok {
		return "", "", "", false
	}
	return kind, name, sanitize(detail), true
}

func classifyRaw(t *archTable, m *pb.Syscall) (Kind, string, string, bool) {
	r, known := t.raw[m.GetSysno()]
	if !known {
		return "", "", "", false
	}
	if r.exit {
		// Refused uid/gid changes only, as for the named setid points.
		if m.GetExit() == nil || m.GetExit().GetErrorno() != errEPERM {
			return "", "", "", false
		}
		return r.kind, r.name, fmt.Sprintf("r=%d e=%d", int32(m.GetArg1()), int32(m.GetArg2())), true
	}
	// Enter points only: if someone also enabled the exit point, the same
	// call must not count twice.
	if m.GetExit() != nil {
		return "", "", "", false
	}
	var detail string
	switch r.name {
	case "unshare":
		detail = fmt.Sprintf("flags=%#x", m.GetArg1())
	case "setns":
		detail = fmt.Sprintf("nstype=%#x", m.GetArg2())
	case "bpf":
		detail = fmt.Sprintf("cmd=%d", m.GetArg1())
	case "keyctl":
		detail = fmt.Sprintf("op=%d", m.GetArg1())
	}
	return r.kind, r.name, detail, true
}

// classifyOpen reports an open for writing that was refused by a read-only
// mount (EROFS) or by permissions (EACCES).
func classifyOpen(t *archTable, m *pb.Open) (Kind, string, string, bool) {
	e := m.GetExit().GetErrorno()
	if e != errEROFS && e != errEACCES {
		return "", "", "", false
	}
	if m.GetFlags()&(oWRONLY|oRDWR|oCREAT|oTRUNC) == 0 {
		// A refused read is not a write attempt (e.g. /proc files).
		return "", "", "", false
	}
	p := m.GetPathname()
	if isBytecodeCache(p) {
		return "", "", "", false
	}
	name := "openat"
	switch {
	case t == archTables["amd64"] && m.GetSysno() == 2:
		name = "open"
	case t == archTables["amd64"] && m.GetSysno() == 85:
		name = "creat"
	}
	return KindReadonlyWrite, name, fmt.Sprintf("%s flags=%#o %s", p, m.GetFlags(), errnoName(e)), true
}

// isBytecodeCache reports whether p is a CPython bytecode cache. CPython
// tries to write a .pyc (through a temporary "<name>.pyc.<id>" file in
// __pycache__) next to every module it imports; for modules on the
// read-only root that write fails with EROFS or EACCES and CPython silently
// carries on. It is benign and happens on nearly every import, so counting it
// would drown the real attempts.
func isBytecodeCache(p string) bool {
	return strings.HasSuffix(p, ".pyc") ||
		strings.Contains(p, "/__pycache__/") ||
		strings.HasPrefix(p, "__pycache__/")
}

// classifyConnect reports an IPv4/IPv6 connect(2) that the sandbox's network
// refused. The Connect point carries the raw sockaddr the program passed, so
// the family is its first two bytes (native, little-endian on amd64 and
// arm64). Loopback destinations never leave the sandbox and are not
// attempts (a refused connection to a local port is ordinary). A
// non-blocking connect returns EINPROGRESS and reports its failure later
// through getsockopt, which this point does not see; the egress proxy and
// firewall count those.
func classifyConnect(m *pb.Connect) (Kind, string, string, bool) {
	e := m.GetExit().GetErrorno()
	switch e {
	case errENETUNREACH, errEACCES, errEPERM, errECONNREFUSED:
	default:
		return "", "", "", false
	}
	addr, ok := parseInetSockaddr(m.GetAddress())
	if !ok || addr.Addr().Unmap().IsLoopback() {
		return "", "", "", false
	}
	return KindConnectBlocked, "connect", addr.String() + " " + errnoName(e), true
}

// parseInetSockaddr decodes a sockaddr_in or sockaddr_in6.
func parseInetSockaddr(b []byte) (netip.AddrPort, bool) {
	if len(b) < 2 {
		return netip.AddrPort{}, false
	}
	switch binary.LittleEndian.Uint16(b[0:2]) {
	case afINET:
		// family u16, port u16 (big-endian), addr [4]byte.
		if len(b) < 8 {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4])), true
	case afINET6:
		// family u16, port u16, flowinfo u32, addr [16]byte, scope u32.
		if len(b) < 24 {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), binary.BigEndian.Uint16(b[2:4])), true
	}
	return netip.AddrPort{}, false
}
