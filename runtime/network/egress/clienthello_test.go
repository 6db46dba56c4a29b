package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// Builders for hand-made ClientHellos.

func u16(n int) []byte { return []byte{byte(n >> 8), byte(n)} }

func vec16(b []byte) []byte { return append(u16(len(b)), b...) }

func ext(typ int, data []byte) []byte { return append(u16(typ), vec16(data)...) }

// sniExt builds a server_name extension with one host_name entry per name.
func sniExt(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, serverNameTypeHost)
		list = append(list, vec16([]byte(n))...)
	}
	return ext(extServerName, vec16(list))
}

// helloBody builds a ClientHello body; exts == nil means no extensions
// block at all.
func helloBody(exts ...[]byte) []byte {
	b := []byte{3, 3}
	b = append(b, make([]byte, 32)...)       // random
	b = append(b, 0)                         // empty session id
	b = append(b, vec16([]byte{0x13, 1})...) // one cipher suite
	b = append(b, 1, 0)                      // null compression
	if exts != nil {
		b = append(b, vec16(bytes.Join(exts, nil))...)
	}
	return b
}

func handshakeMsg(typ byte, body []byte) []byte {
	return append([]byte{typ, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
}

func record(typ byte, payload []byte) []byte {
	return append([]byte{typ, 3, 1, byte(len(payload) >> 8), byte(len(payload))}, payload...)
}

func hello(exts ...[]byte) []byte {
	return record(recordTypeHandshake, handshakeMsg(handshakeClientHello, helloBody(exts...)))
}

func TestParseClientHelloReal(t *testing.T) {
	tests := []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"tls13 with sni", &tls.Config{ServerName: "allowed.test"}, "allowed.test"},
		{"tls12 only", &tls.Config{ServerName: "pypi.org", MaxVersion: tls.VersionTLS12}, "pypi.org"},
		{"no sni", &tls.Config{InsecureSkipVerify: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := captureHello(t, tt.cfg)
			for _, frag := range []int{0, 1, 7, 100} {
				data := rec
				if frag > 0 {
					data = refragment(rec, frag)
				}
				h, n, err := parseClientHello(data)
				if err != nil {
					t.Fatalf("fragments of %d: %v", frag, err)
				}
				if h.serverName != tt.want || n != len(data) {
					t.Errorf("fragments of %d: got (%q, %d), want (%q, %d)", frag, h.serverName, n, tt.want, len(data))
				}
				// Every strict prefix must ask for more, never fail or succeed:
				// the reading loop relies on this. (Skipped for 1-byte
				// records only to keep the test fast; the fuzzer covers it.)
				if frag == 1 {
					continue
				}
				for i := range len(data) {
					if _, _, err := parseClientHello(data[:i]); !errors.Is(err, errHelloIncomplete) {
						t.Fatalf("fragments of %d: prefix of %d bytes: %v, want errHelloIncomplete", frag, i, err)
					}
				}
			}
		})
	}
}

func TestParseClientHelloCrafted(t *testing.T) {
	big := make([]byte, 0, 3)
	big = append(big, handshakeClientHello, 0x00, 0x50, 0x00) // claims 20480 bytes
	tests := []struct {
		name    string
		data    []byte
		sni     string
		wantErr string // "" for success
	}{
		{"sni", hello(sniExt("Allowed.Test")), "Allowed.Test", ""},
		{"no extensions", hello(), "", ""},
		{"other extension only", hello(ext(0x000a, []byte{0, 2, 0, 0x1d})), "", ""},
		{"unknown name type skipped", hello(ext(extServerName, vec16(append([]byte{9, 0, 1, 'x'}, append([]byte{0}, vec16([]byte("a.test"))...)...)))), "a.test", ""},
		{"not tls", []byte("GET / HTTP/1.1\r\n\r\n"), "", "not a TLS handshake"},
		{"sslv2", []byte{0x80, 0x2e, 0x01, 0x03, 0x01}, "", "not a TLS handshake"},
		{"bad record version", append([]byte{0x16, 2, 0}, hello()[3:]...), "", "not TLS"},
		{"zero-length record", []byte{0x16, 3, 1, 0, 0}, "", "out of range"},
		{"record too long", []byte{0x16, 3, 1, 0x40, 0x01}, "", "out of range"},
		{"server hello", record(recordTypeHandshake, handshakeMsg(2, helloBody())), "", "not ClientHello"},
		{"hello too big", record(recordTypeHandshake, big), "", "exceeds"},
		{"alert between fragments", append(refragment(hello(sniExt("a.test")), 10)[:15], record(0x15, []byte{2, 40})...), "", "record type 0x15"},
		{"trailing handshake bytes", record(recordTypeHandshake, append(handshakeMsg(handshakeClientHello, helloBody()), 0x14)), "", "trailing"},
		{"duplicate sni ext", hello(sniExt("a.test"), sniExt("b.test")), "", "duplicate extension"},
		{"two host names", hello(sniExt("a.test", "b.test")), "", "more than one host_name"},
		{"empty host name", hello(sniExt("")), "", "empty host_name"},
		{"nul in host name", hello(sniExt("a.test\x00.evil")), "", "contains byte"},
		{"empty sni list", hello(ext(extServerName, vec16(nil))), "", "malformed server_name"},
		{"empty sni ext", hello(ext(extServerName, nil)), "", "malformed server_name"},
		{"sni list overruns", hello(ext(extServerName, []byte{0, 9, 0, 0, 1, 'a'})), "", "malformed server_name"},
		{"extension overruns", record(recordTypeHandshake, handshakeMsg(handshakeClientHello, append(helloBody(), 0, 4, 0, 0, 0, 9))), "", "truncated extension"},
		{"extensions length mismatch", record(recordTypeHandshake, handshakeMsg(handshakeClientHello, append(helloBody(), 0, 1))), "", "malformed extensions"},
		{"session id too long", record(recordTypeHandshake, handshakeMsg(handshakeClientHello, append(append([]byte{3, 3}, make([]byte, 32)...), append([]byte{33}, make([]byte, 33)...)...))), "", "session id"},
		{"odd cipher list", record(recordTypeHandshake, handshakeMsg(handshakeClientHello, append(append([]byte{3, 3}, make([]byte, 33)...), 0, 1, 0x13, 1, 0))), "", "cipher suite"},
		{"truncated body", record(recordTypeHandshake, handshakeMsg(handshakeClientHello, []byte{3, 3, 0})), "", "truncated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _, err := parseClientHello(tt.data)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if h.serverName != tt.sni {
					t.Errorf("SNI = %q, want %q", h.serverName, tt.sni)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestReadClientHello(t *testing.T) {
	rec := captureHello(t, &tls.Config{ServerName: "allowed.test"})
	frag := refragment(rec, 13)

	t.Run("one byte per read", func(t *testing.T) {
		extra := []byte("early data that must be returned too")
		got, h, err := readClientHello(iotest.OneByteReader(bytes.NewReader(append(frag, extra...))))
		if err != nil {
			t.Fatal(err)
		}
		if h.serverName != "allowed.test" {
			t.Errorf("SNI = %q", h.serverName)
		}
		// Everything read must be handed back for forwarding, byte for byte.
		if !bytes.HasPrefix(append(frag, extra...), got) || len(got) < len(frag) {
			t.Errorf("returned %d bytes that are not a prefix of the stream", len(got))
		}
	})
	t.Run("eof mid hello", func(t *testing.T) {
		got, _, err := readClientHello(bytes.NewReader(frag[:len(frag)/2]))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("err = %v, want ErrUnexpectedEOF", err)
		}
		if len(got) != len(frag)/2 {
			t.Errorf("returned %d bytes, want the %d read", len(got), len(frag)/2)
		}
	})
	t.Run("non tls", func(t *testing.T) {
		_, _, err := readClientHello(strings.NewReader("SSH-2.0-OpenSSH_9.6\r\n"))
		if !errors.Is(err, errNotTLS) {
			t.Errorf("err = %v, want errNotTLS", err)
		}
	})
	t.Run("cap", func(t *testing.T) {
		// A legal-looking hello of 12 KiB sent as 1-byte records takes
		// 6 bytes on the wire per byte of hello: the raw cap must stop it.
		body := helloBody(ext(0x0015, make([]byte, 12<<10))) // padding extension
		stream := refragment(record(recordTypeHandshake, handshakeMsg(handshakeClientHello, body)), 1)
		r := &countingReader{r: bytes.NewReader(stream)}
		_, _, err := readClientHello(r)
		if err == nil || !strings.Contains(err.Error(), "no complete ClientHello in the first") {
			t.Fatalf("err = %v, want the cap error", err)
		}
		if r.n > maxHelloBytes {
			t.Errorf("read %d bytes, more than the %d cap", r.n, maxHelloBytes)
		}
		// The same hello in normal records is accepted: the cap is about
		// bytes read, not about a legal hello's size.
		if _, _, err := parseClientHello(record(recordTypeHandshake, handshakeMsg(handshakeClientHello, body))); err != nil {
			t.Errorf("12 KiB hello in one record: %v", err)
		}
	})
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzParseClientHello checks that the parser never panics and that its
// answers are consistent with the reading loop's assumptions: a success
// reports how many bytes it used, the hello parses the same from exactly
// those bytes, and one byte fewer is "incomplete".
func FuzzParseClientHello(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, n, err := parseClientHello(data)
		if err != nil {
			if n != 0 || h.serverName != "" {
				t.Fatalf("error %v with n=%d sni=%q", err, n, h.serverName)
			}
			return
		}
		if n <= 0 || n > len(data) {
			t.Fatalf("n = %d for %d bytes", n, len(data))
		}
		for _, c := range []byte(h.serverName) {
			if c <= ' ' || c >= 0x7f {
				t.Fatalf("SNI %q has byte %#x", h.serverName, c)
			}
		}
		h2, n2, err := parseClientHello(data[:n])
		if err != nil || h2 != h || n2 != n {
			t.Fatalf("reparse of the %d used bytes: %v %q %d", n, err, h2.serverName, n2)
		}
		if _, _, err := parseClientHello(data[:n-1]); !errors.Is(err, errHelloIncomplete) {
			t.Fatalf("one byte short: %v, want errHelloIncomplete", err)
		}
	})
}

func fuzzSeeds(t testing.TB) [][]byte {
	real13 := captureHello(t, &tls.Config{ServerName: "allowed.test"})
	return [][]byte{
		real13,
		captureHello(t, &tls.Config{ServerName: "pypi.org", MaxVersion: tls.VersionTLS12}),
		captureHello(t, &tls.Config{InsecureSkipVerify: true}),
		refragment(real13, 7),
		hello(sniExt("a.test")),
		hello(),
		hello(sniExt("a.test", "b.test")),
		real13[:40],
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzParseClientHello. It
// only runs when asked, since the checked-in corpus must stay stable:
//
//	AIRLOCK_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./runtime/network/egress/
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("AIRLOCK_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set AIRLOCK_WRITE_FUZZ_SEEDS=1 to regenerate the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParseClientHello")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"tls13-sni", "tls12-sni", "no-sni", "fragmented", "crafted-sni", "no-extensions", "two-host-names", "truncated", "plain-http"}
	for i, s := range fuzzSeeds(t) {
		content := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, names[i]), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
