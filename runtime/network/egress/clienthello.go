package egress

import (
	"errors"
	"fmt"
	"io"
)

// maxHelloBytes caps how many bytes the proxy reads from a tunnel while
// looking for the ClientHello, record headers included. Real ClientHellos
// are a few hundred bytes (about 1.8 KiB with a post-quantum key share);
// the cap keeps a hostile client from making the proxy buffer without
// bound before anything has been checked.
const maxHelloBytes = 16 << 10

const (
	recordTypeHandshake   = 0x16
	handshakeClientHello  = 0x01
	recordHeaderLen       = 5
	handshakeHeaderLen    = 4
	maxRecordPlaintextLen = 1 << 14 // RFC 8446 §5.1
	extServerName         = 0x0000
	serverNameTypeHost    = 0x00
)

// errHelloIncomplete means the bytes so far are a valid prefix of a
// ClientHello and more are needed. Every other error is final.
var errHelloIncomplete = errors.New("incomplete ClientHello")

// errNotTLS means the first byte is not a TLS handshake record, i.e. the
// client is not starting TLS at all.
var errNotTLS = errors.New("not a TLS handshake")

// clientHello is what the proxy needs from the handshake.
type clientHello struct {
	serverName string // "" when the client sent no server_name extension
}

// parseClientHello parses a TLS ClientHello from the start of b, following
// the handshake message across as many handshake records as it spans. It
// returns the hello, the number of bytes of b its records occupy, and an
// error: errHelloIncomplete when b is a valid but short prefix, errNotTLS
// when b does not start with a handshake record, or a description of what
// is malformed.
//
// Written by hand, not with crypto/tls, so the proxy can inspect a hello
// without terminating TLS and without buffering more than the hello itself.
// It is strict where laxness could let two parsers disagree about the SNI
// (duplicate extensions, several host names, trailing bytes).
func parseClientHello(b []byte) (clientHello, int, error) {
	if len(b) == 0 {
		return clientHello{}, 0, errHelloIncomplete
	}
	if b[0] != recordTypeHandshake {
		return clientHello{}, 0, errNotTLS
	}

	// Reassemble the handshake message from record fragments.
	var (
		msg  []byte
		off  int
		need = -1 // total handshake bytes wanted, known after its header
	)
	for need < 0 || len(msg) < need {
		if len(b)-off < recordHeaderLen {
			if err := checkPartialRecordHeader(b[off:]); err != nil {
				return clientHello{}, 0, err
			}
			return clientHello{}, 0, errHelloIncomplete
		}
		h := b[off : off+recordHeaderLen]
		if h[0] != recordTypeHandshake {
			return clientHello{}, 0, fmt.Errorf("record type %#x inside the ClientHello", h[0])
		}
		if h[1] != 3 {
			return clientHello{}, 0, fmt.Errorf("record version %d.%d is not TLS", h[1], h[2])
		}
		n := int(h[3])<<8 | int(h[4])
		if n == 0 || n > maxRecordPlaintextLen {
			return clientHello{}, 0, fmt.Errorf("record length %d out of range", n)
		}
		if len(b)-off-recordHeaderLen < n {
			return clientHello{}, 0, errHelloIncomplete
		}
		msg = append(msg, b[off+recordHeaderLen:off+recordHeaderLen+n]...)
		off += recordHeaderLen + n
		if need < 0 && len(msg) >= handshakeHeaderLen {
			if msg[0] != handshakeClientHello {
				return clientHello{}, 0, fmt.Errorf("handshake type %d is not ClientHello", msg[0])
			}
			body := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if body > maxHelloBytes {
				return clientHello{}, 0, fmt.Errorf("ClientHello of %d bytes exceeds the %d-byte cap", body, maxHelloBytes)
			}
			need = handshakeHeaderLen + body
		}
	}
	if len(msg) != need {
		// A ClientHello is the client's whole first flight; more handshake
		// bytes in its last record cannot be valid.
		return clientHello{}, 0, errors.New("trailing handshake data after the ClientHello")
	}
	hello, err := parseClientHelloBody(msg[handshakeHeaderLen:])
	if err != nil {
		return clientHello{}, 0, err
	}
	return hello, off, nil
}

// checkPartialRecordHeader rejects a truncated record header early when the
// bytes present already rule it out, so junk is refused without waiting.
func checkPartialRecordHeader(h []byte) error {
	if len(h) >= 1 && h[0] != recordTypeHandshake {
		return fmt.Errorf("record type %#x inside the ClientHello", h[0])
	}
	if len(h) >= 2 && h[1] != 3 {
		return fmt.Errorf("record version %d is not TLS", h[1])
	}
	return nil
}

// parseClientHelloBody walks the ClientHello structure (RFC 8446 §4.1.2,
// compatible with TLS 1.0–1.2) and extracts the server_name (RFC 6066 §3).
func parseClientHelloBody(b []byte) (clientHello, error) {
	r := reader{b: b}
	r.skip(2 + 32) // legacy_version, random
	if sid := r.vec8(); len(sid) > 32 {
		return clientHello{}, errors.New("session id longer than 32 bytes")
	}
	suites := r.vec16()
	if r.err == nil && (len(suites) == 0 || len(suites)%2 != 0) {
		return clientHello{}, errors.New("malformed cipher suite list")
	}
	if comp := r.vec8(); r.err == nil && len(comp) == 0 {
		return clientHello{}, errors.New("empty compression method list")
	}
	if r.err != nil {
		return clientHello{}, fmt.Errorf("truncated ClientHello: %w", r.err)
	}
	var hello clientHello
	if r.empty() {
		return hello, nil // TLS 1.0-style hello without extensions
	}
	exts := reader{b: r.vec16()}
	if r.err != nil || !r.empty() {
		return clientHello{}, errors.New("malformed extensions block")
	}
	seen := map[uint16]bool{}
	for !exts.empty() {
		typ := exts.u16()
		data := exts.vec16()
		if exts.err != nil {
			return clientHello{}, fmt.Errorf("truncated extension: %w", exts.err)
		}
		if seen[typ] {
			return clientHello{}, fmt.Errorf("duplicate extension %#04x", typ)
		}
		seen[typ] = true
		if typ != extServerName {
			continue
		}
		name, err := parseServerName(data)
		if err != nil {
			return clientHello{}, err
		}
		hello.serverName = name
	}
	return hello, nil
}

func parseServerName(data []byte) (string, error) {
	ext := reader{b: data}
	list := reader{b: ext.vec16()}
	if ext.err != nil || !ext.empty() || list.empty() {
		return "", errors.New("malformed server_name extension")
	}
	var name string
	for !list.empty() {
		typ := list.u8()
		v := list.vec16()
		if list.err != nil {
			return "", errors.New("malformed server_name list")
		}
		if typ != serverNameTypeHost {
			continue // unknown name types are skipped, as RFC 6066 allows
		}
		if name != "" {
			return "", errors.New("more than one host_name in server_name")
		}
		if len(v) == 0 {
			return "", errors.New("empty host_name in server_name")
		}
		for _, c := range v {
			if c <= ' ' || c >= 0x7f {
				return "", fmt.Errorf("host_name contains byte %#x", c)
			}
		}
		name = string(v)
	}
	if name == "" {
		return "", errors.New("server_name extension without a host_name")
	}
	return name, nil
}

// reader is a bounds-checked cursor over TLS wire structures. After the
// first short read every method returns zero values and err stays set, so
// callers check err once after a group of reads.
type reader struct {
	b   []byte
	err error
}

func (r *reader) empty() bool { return r.err == nil && len(r.b) == 0 }

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = io.ErrUnexpectedEOF
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int) { r.take(n) }

func (r *reader) u8() int {
	v := r.take(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() uint16 {
	v := r.take(2)
	if v == nil {
		return 0
	}
	return uint16(v[0])<<8 | uint16(v[1])
}

func (r *reader) vec8() []byte  { return r.take(r.u8()) }
func (r *reader) vec16() []byte { return r.take(int(r.u16())) }

// readClientHello reads from r until buf holds a complete ClientHello, the
// data is found not to be one, or maxHelloBytes have been read. It returns
// every byte it read (which the caller must forward, since they were taken
// off the client's stream), whether or not parsing succeeded. The caller
// sets the read deadline.
func readClientHello(r io.Reader) ([]byte, clientHello, error) {
	buf := make([]byte, 0, 2048)
	for {
		hello, _, err := parseClientHello(buf)
		if err == nil {
			return buf, hello, nil
		}
		if !errors.Is(err, errHelloIncomplete) {
			return buf, clientHello{}, err
		}
		if len(buf) >= maxHelloBytes {
			return buf, clientHello{}, fmt.Errorf("no complete ClientHello in the first %d bytes", maxHelloBytes)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(cap(buf), maxHelloBytes-len(buf)))...)[:len(buf)]
		}
		n, rerr := r.Read(buf[len(buf):min(cap(buf), maxHelloBytes)])
		buf = buf[:len(buf)+n]
		if rerr != nil && n == 0 {
			if errors.Is(rerr, io.EOF) {
				rerr = io.ErrUnexpectedEOF
			}
			return buf, clientHello{}, fmt.Errorf("reading ClientHello: %w", rerr)
		}
	}
}
