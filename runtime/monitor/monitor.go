// Package monitor receives gVisor Runtime Monitoring events from the sandboxes
// and turns the few that matter into escape attempts.
//
// Each sandbox is started with a trace session (see [Config]) whose remote
// sink is a [Listener] inside airlock. runsc connects one AF_UNIX
// SOCK_SEQPACKET socket per sandbox, performs a handshake and then streams one
// framed protobuf message per trace point. Everything that arrives on the
// socket is produced by the sentry on behalf of untrusted code (paths,
// addresses, flags), so it is parsed with bounded sizes and never trusted
// beyond "this is what the sandboxed code asked for".
package monitor

import (
	"log/slog"
	"strings"
	"unicode"
)

// Kind names a class of escape attempt. The string values are stable: they are
// used as metric labels, in run results and in audit records.
type Kind string

// The kinds of attempt the classifier reports.
const (
	// KindMount is mount(2), umount2(2) or pivot_root(2).
	KindMount Kind = "mount"
	// KindNamespace is unshare(2), setns(2) or clone(2) with a CLONE_NEW* flag.
	KindNamespace Kind = "namespace"
	// KindModule is a kernel module load/unload or kexec.
	KindModule Kind = "module"
	// KindPtrace is any ptrace(2) request, PTRACE_TRACEME included.
	KindPtrace Kind = "ptrace"
	// KindPrivilege is a refused (EPERM) uid/gid change, or any chroot(2).
	KindPrivilege Kind = "privilege"
	// KindKernel is a call into a kernel attack surface that sandboxed
	// programs have no business using: bpf, keyrings, perf events,
	// userfaultfd.
	KindKernel Kind = "kernel"
	// KindReadonlyWrite is an open for writing that failed with EROFS or
	// EACCES (a write to the read-only root or to a path the user may not
	// write).
	KindReadonlyWrite Kind = "readonly_write"
	// KindRawSocket is socket(2) with SOCK_RAW/SOCK_PACKET or AF_PACKET.
	KindRawSocket Kind = "raw_socket"
	// KindConnectBlocked is an IPv4/IPv6 connect(2) to a non-loopback
	// address refused by the sandbox's network (ENETUNREACH, EACCES, EPERM,
	// ECONNREFUSED).
	KindConnectBlocked Kind = "connect_blocked"
)

// Kinds lists every Kind, in a stable order (for metric pre-registration and
// config validation).
func Kinds() []Kind {
	return []Kind{KindMount, KindNamespace, KindModule, KindPtrace, KindPrivilege,
		KindKernel, KindReadonlyWrite, KindRawSocket, KindConnectBlocked}
}

// Event is one classified attempt seen in a sandbox.
type Event struct {
	// ContainerID is the container_id context field of the trace point: the
	// OCI container id runsc was started with, which maps the event to a
	// run. It is empty if the sentry did not send it.
	ContainerID string
	// Kind is the attempt's class.
	Kind Kind
	// Syscall is the syscall name, e.g. "mount" or "openat".
	Syscall string
	// Detail is a short, human-readable description of the arguments
	// (path, address, flags). It comes from the sandbox: it is sanitised
	// (printable, at most maxDetail bytes) but must still be treated as
	// untrusted text.
	Detail string
}

// Options configures a [Listener]. The zero value is usable.
type Options struct {
	// OnEvent receives every classified attempt. It is called synchronously
	// from the connection's reader goroutine, so it must return quickly
	// (count, append under a mutex, or a non-blocking channel send): while
	// it runs the sandbox's socket buffer fills and runsc starts dropping
	// events. Calls for different sandboxes may run concurrently.
	OnEvent func(Event)
	// OnDropped receives, for each header that reports more dropped events
	// than the previous one, the number of events runsc dropped since then
	// (its socket buffer was full). containerID is the last container id
	// seen on that connection ("" if none yet). Same rules as OnEvent.
	OnDropped func(containerID string, n uint64)
	// OnMalformed is called once for each message that could not be parsed
	// (bad header, truncated, undecodable payload); the message is skipped.
	OnMalformed func(containerID string, err error)
	// OnConnClosed, if set, is called when a sandbox's connection ends,
	// with the error that ended it (nil for an orderly close by runsc, for
	// example when the sandbox exits).
	OnConnClosed func(containerID string, err error)
	// MaxConns bounds concurrent sandbox connections; further connections
	// are closed at once (which makes that sandbox's creation fail, the safe
	// outcome). Default 1024.
	MaxConns int
	// Log receives connection-level log lines. Default slog.Default().
	Log *slog.Logger
}

// DefaultMaxConns is the default for Options.MaxConns.
const DefaultMaxConns = 1024

// maxDetail bounds Event.Detail.
const maxDetail = 256

// sanitize makes untrusted text safe to log and return: control and
// non-printable characters become '?', invalid UTF-8 is replaced and the
// result is cut to maxDetail bytes on a rune boundary.
func sanitize(s string) string {
	if len(s) > 4*maxDetail {
		s = s[:4*maxDetail]
	}
	s = strings.ToValidUTF8(s, "?")
	var b strings.Builder
	for _, r := range s {
		if !unicode.IsPrint(r) {
			r = '?'
		}
		if b.Len()+len(string(r)) > maxDetail {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
