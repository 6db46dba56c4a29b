package tools

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseRunArgs feeds arbitrary JSON (as a client would send it) to the
// run tools' argument decoding. It must never panic, every refusal must be
// an ArgError (a message for the caller, not a crash), and whatever it
// accepts must hold to the limits the runtime relies on.
//
// Seeds: testdata/fuzz/FuzzParseRunArgs. Run longer with
//
//	go test -run '^$' -fuzz '^FuzzParseRunArgs$' -fuzztime 5m ./tools
func FuzzParseRunArgs(f *testing.F) {
	for _, s := range []string{
		`{"code": "print(1)"}`,
		`{"code": "x", "timeout_s": 300, "network": "allowlist", "allow_domains": ["pypi.org"]}`,
		`{"code": "x", "session_id": "s0123abcd"}`,
		`{"code": "x", "session_id": "s1", "network": "none"}`,
		`{"code": "\u0000"}`,
		`{"code": 1}`,
		`{"timeout_s": 1.5, "code": "x"}`,
		`[]`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	lim := ArgLimits{CodeBytes: 64, MaxTimeoutS: 300}
	f.Fuzz(func(t *testing.T, data []byte) {
		var raw any
		if json.Unmarshal(data, &raw) != nil {
			return
		}
		args, err := ParseRunArgs("run_python", "code", raw, lim)
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Msg == "" {
				t.Fatalf("refusal %v is not an ArgError with a message", err)
			}
			return
		}
		switch {
		case strings.TrimSpace(args.Code) == "", len(args.Code) > lim.CodeBytes, strings.IndexByte(args.Code, 0) >= 0, !utf8.ValidString(args.Code):
			t.Fatalf("accepted code %q", args.Code)
		case args.Timeout < 0 || args.Timeout > lim.MaxTimeoutS:
			t.Fatalf("accepted timeout %d", args.Timeout)
		case args.Network != "" && args.Network != "none" && args.Network != "allowlist":
			t.Fatalf("accepted network %q", args.Network)
		case args.Network == "none" && args.AllowDomains != nil:
			t.Fatal("accepted allow_domains with network none")
		case args.SessionID != "" && (args.Network != "" || args.AllowDomains != nil):
			t.Fatal("accepted a network with a session")
		}
		for _, r := range args.SessionID {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
				t.Fatalf("accepted session id %q", args.SessionID)
			}
		}
		for _, d := range args.AllowDomains {
			if d == "" {
				t.Fatal("accepted an empty domain")
			}
		}
	})
}
