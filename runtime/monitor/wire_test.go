package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// frame builds a message exactly as runsc's remote sink does (remote.write):
// an 8-byte little-endian header followed by the marshalled payload.
func frame(t testing.TB, mt pb.MessageType, dropped uint32, msg proto.Message) []byte {
	t.Helper()
	out, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return frameRaw(headerSize, uint16(mt), dropped, nil, out)
}

// frameRaw allows any header size; extra header bytes are filled from ext.
func frameRaw(hsize, mt uint16, dropped uint32, ext, payload []byte) []byte {
	b := make([]byte, 8, 8+len(ext)+len(payload))
	binary.LittleEndian.PutUint16(b[0:2], hsize)
	binary.LittleEndian.PutUint16(b[2:4], mt)
	binary.LittleEndian.PutUint32(b[4:8], dropped)
	b = append(b, ext...)
	return append(b, payload...)
}

// seedMessages are realistic events, as the sentry would encode them.
func seedMessages(t testing.TB) map[string][]byte {
	c := ctx("airlock-run-0123456789abcdef")
	return map[string][]byte{
		"mount_enter":    frame(t, pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{ContextData: c, Sysno: 165, Arg1: 0x7ffd0000, Arg2: 0x7ffd0010, Arg3: 0x7ffd0020}),
		"openat_erofs":   frame(t, pb.MessageType_MESSAGE_SYSCALL_OPEN, 0, &pb.Open{ContextData: c, Sysno: 257, Fd: -100, Pathname: "/usr/lib/evil.so", Flags: oWRONLY | oCREAT | oTRUNC | 0x80000, Mode: 0o644, Exit: exit(errEROFS)}),
		"connect_unr":    frame(t, pb.MessageType_MESSAGE_SYSCALL_CONNECT, 2, &pb.Connect{ContextData: c, Sysno: 42, Fd: 3, Address: sockaddr4([4]byte{93, 184, 216, 34}, 443), Exit: exit(errENETUNREACH)}),
		"ptrace_traceme": frame(t, pb.MessageType_MESSAGE_SYSCALL_PTRACE, 2, &pb.Ptrace{ContextData: c, Sysno: 101}),
		"setid_eperm":    frame(t, pb.MessageType_MESSAGE_SYSCALL_SETID, 3, &pb.Setid{ContextData: c, Sysno: 105, Exit: exit(errEPERM)}),
		"clone_newuser":  frame(t, pb.MessageType_MESSAGE_SYSCALL_CLONE, 0, &pb.Clone{ContextData: c, Sysno: 56, Flags: 0x10000000 | 17}),
		"socket_raw":     frame(t, pb.MessageType_MESSAGE_SYSCALL_SOCKET, 0, &pb.Socket{ContextData: c, Sysno: 41, Domain: afINET, Type: sockRAW, Protocol: 1}),
		"task_exit":      frame(t, pb.MessageType_MESSAGE_SENTRY_TASK_EXIT, 0, &pb.TaskExit{ContextData: c, ExitStatus: 0}),
		"newer_header":   frameRaw(12, uint16(pb.MessageType_MESSAGE_SYSCALL_CHROOT), 0, []byte{1, 2, 3, 4}, mustMarshal(t, &pb.Chroot{ContextData: c, Sysno: 161, Pathname: "/tmp"})),
	}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMessage(t *testing.T) {
	seeds := seedMessages(t)
	h, msg, err := ParseMessage(seeds["newer_header"])
	if err != nil || h.HeaderSize != 12 || msg.(*pb.Chroot).GetPathname() != "/tmp" {
		t.Fatalf("newer header: %+v %v %v", h, msg, err)
	}
	h, msg, err = ParseMessage(seeds["connect_unr"])
	if err != nil || h.DroppedCount != 2 || containerID(msg) != "airlock-run-0123456789abcdef" {
		t.Fatalf("connect: %+v %v %v", h, msg, err)
	}
	if _, msg, err := ParseMessage(seeds["task_exit"]); err != nil || msg != nil {
		t.Fatalf("ignored type: %v %v", msg, err)
	}
	for name, b := range map[string][]byte{
		"empty":           nil,
		"short":           {8, 0, 6},
		"header size 4":   frameRaw(4, 6, 0, nil, nil),
		"header past end": frameRaw(200, 6, 0, nil, []byte{1}),
		"bad payload":     frameRaw(8, uint16(pb.MessageType_MESSAGE_SYSCALL_RAW), 0, nil, []byte{0xff, 0xff, 0xff}),
		"bad utf8 path":   frameRaw(8, uint16(pb.MessageType_MESSAGE_SYSCALL_OPEN), 0, nil, []byte{0x32, 2, 0xff, 0xfe}),
		"too large":       make([]byte, MaxMessageSize+1),
	} {
		if _, _, err := ParseMessage(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, _, err := ParseMessage(make([]byte, MaxMessageSize+1)); !errors.Is(err, errTooLarge) {
		t.Errorf("too large: %v", err)
	}
}

// TestWriteSeedCorpus regenerates testdata/fuzz/FuzzParseMessage from
// seedMessages when MONITOR_WRITE_CORPUS=1; otherwise it checks the files
// are there.
func TestWriteSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParseMessage")
	for name, b := range seedMessages(t) {
		p := filepath.Join(dir, name)
		if os.Getenv("MONITOR_WRITE_CORPUS") == "1" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("seed %s missing (run with MONITOR_WRITE_CORPUS=1): %v", name, err)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	for _, b := range seedMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		h, msg, err := ParseMessage(b)
		if msg != nil {
			Classify(pb.MessageType(h.MessageType), msg)
			containerID(msg)
		}
		runtime.ReadMemStats(&after)
		if err == nil && len(b) > MaxMessageSize {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if err == nil && (h.HeaderSize < headerSize || int(h.HeaderSize) > len(b)) {
			t.Fatalf("accepted header size %d for %d bytes", h.HeaderSize, len(b))
		}
		// Allocation must stay proportional to the input, which is itself
		// bounded by the read buffer. The slack covers the runtime's own
		// allocations between the two snapshots.
		if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(64*len(b)+256<<10); got > limit {
			t.Fatalf("allocated %d bytes for a %d-byte message (limit %d)", got, len(b), limit)
		}
	})
}
