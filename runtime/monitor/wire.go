package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
)

// Wire constants from gVisor's pkg/sentry/seccheck/sinks/remote/wire/wire.go.
const (
	// wireVersion is the only protocol version this listener speaks
	// (wire.CurrentVersion).
	wireVersion = 1
	// headerSize is wire.HeaderStructSize: u16 header size, u16 message
	// type, u32 dropped count, little-endian.
	headerSize = 8
	// MaxMessageSize bounds one message (header and payload). The largest
	// message the classifier asks for is an open/connect with a PATH_MAX
	// (4096) path or a sockaddr (at most 128 bytes) plus context data, far
	// below this; anything longer is truncated by the read and counted as
	// malformed.
	MaxMessageSize = 64 << 10
)

// Header is the fixed part in front of every message after the handshake.
type Header struct {
	// HeaderSize is the header's length in bytes; a newer runsc may send
	// a longer header, whose extra bytes are skipped.
	HeaderSize uint16
	// MessageType is a pb.MessageType and says how to decode the payload.
	MessageType uint16
	// DroppedCount is the sink's running count of dropped events; it
	// wraps around after max(uint32).
	DroppedCount uint32
}

var (
	errShort     = errors.New("message shorter than its header")
	errHeaderLen = errors.New("header size out of range")
	errTooLarge  = errors.New("message larger than the maximum")
)

// ParseMessage parses one message: the header, then, if the message type is
// one the classifier uses, its protobuf payload. For other types it returns a
// nil message and no error (they are ignored, not malformed). The returned
// message does not alias b.
func ParseMessage(b []byte) (Header, proto.Message, error) {
	var h Header
	if len(b) > MaxMessageSize {
		return h, nil, errTooLarge
	}
	if len(b) < headerSize {
		return h, nil, errShort
	}
	h.HeaderSize = binary.LittleEndian.Uint16(b[0:2])
	h.MessageType = binary.LittleEndian.Uint16(b[2:4])
	h.DroppedCount = binary.LittleEndian.Uint32(b[4:8])
	if h.HeaderSize < headerSize || int(h.HeaderSize) > len(b) {
		return h, nil, fmt.Errorf("%w: %d in a %d-byte message", errHeaderLen, h.HeaderSize, len(b))
	}
	msg := newMessage(pb.MessageType(h.MessageType))
	if msg == nil {
		return h, nil, nil
	}
	if err := proto.Unmarshal(b[h.HeaderSize:], msg); err != nil {
		return h, nil, fmt.Errorf("decoding %s payload: %w", pb.MessageType(h.MessageType), err)
	}
	return h, msg, nil
}

// newMessage returns an empty message for the types the classifier looks at,
// nil for the rest. The mapping is the one the remote sink uses
// (pkg/sentry/seccheck/sinks/remote/remote.go and the Point* functions in
// pkg/sentry/syscalls/linux/points.go).
func newMessage(t pb.MessageType) proto.Message {
	switch t {
	case pb.MessageType_MESSAGE_SYSCALL_RAW:
		return &pb.Syscall{}
	case pb.MessageType_MESSAGE_SYSCALL_OPEN:
		return &pb.Open{}
	case pb.MessageType_MESSAGE_SYSCALL_CONNECT:
		return &pb.Connect{}
	case pb.MessageType_MESSAGE_SYSCALL_SOCKET:
		return &pb.Socket{}
	case pb.MessageType_MESSAGE_SYSCALL_SETID:
		return &pb.Setid{}
	case pb.MessageType_MESSAGE_SYSCALL_SETRESID:
		return &pb.Setresid{}
	case pb.MessageType_MESSAGE_SYSCALL_CHROOT:
		return &pb.Chroot{}
	case pb.MessageType_MESSAGE_SYSCALL_CLONE:
		return &pb.Clone{}
	case pb.MessageType_MESSAGE_SYSCALL_PTRACE:
		return &pb.Ptrace{}
	}
	return nil
}

// containerID extracts the container_id context field from any message that
// carries context data.
func containerID(msg proto.Message) string {
	type hasContext interface{ GetContextData() *pb.ContextData }
	if m, ok := msg.(hasContext); ok {
		return m.GetContextData().GetContainerId()
	}
	return ""
}
