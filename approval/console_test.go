package approval

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoadTokensCreatesOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "approver.tokens")
	first, err := LoadTokens(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || first[0].Name != "approver" || len(first[0].Secret) < 32 {
		t.Fatalf("created tokens = %+v", first)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode = %v, %v; want 0600", st.Mode(), err)
	}
	again, err := LoadTokens(path, true)
	if err != nil || again[0] != first[0] {
		t.Errorf("second load = %+v, %v; want the same token", again, err)
	}
}

func TestLoadTokensFormat(t *testing.T) {
	cases := []struct {
		name, text, err string
		want            []Token
	}{
		{"named and bare", "# comment\nalice:0123456789abcdef0123\n\n0123456789abcdefXXXX\n", "", []Token{{"alice", "0123456789abcdef0123"}, {"approver", "0123456789abcdefXXXX"}}},
		{"short secret", "bob:short\n", "line 1", nil},
		{"empty", "# nothing\n", "no token", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "t")
			_ = os.WriteFile(p, []byte(c.text), 0o600)
			got, err := LoadTokens(p, false)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(got) != len(c.want) {
				t.Fatalf("got %+v, %v", got, err)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("token %d = %+v, want %+v", i, got[i], c.want[i])
				}
			}
		})
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "missing"), false); err == nil {
		t.Error("a missing file without create must fail")
	}
}

func TestConsoleHosts(t *testing.T) {
	for _, tc := range []struct {
		listen  string
		extra   []string
		want    []string // among the hosts
		notWant []string
		err     bool
	}{
		{listen: "127.0.0.1:8766", want: []string{"127.0.0.1:8766", "localhost:8766", "[::1]:8766"}, notWant: []string{"127.0.0.1:9999"}},
		{listen: "10.0.0.5:9000", want: []string{"10.0.0.5:9000"}, notWant: []string{"localhost:9000", "127.0.0.1:9000"}},
		// Every address: each of this machine's, loopback included.
		{listen: "0.0.0.0:9000", want: []string{"0.0.0.0:9000", "127.0.0.1:9000", "localhost:9000"}, notWant: []string{"evil.example:9000", "127.0.0.1:9001"}},
		{listen: ":9000", want: []string{"127.0.0.1:9000"}},
		{listen: "127.0.0.1:8766", extra: []string{"airlock-console.airlock.svc:8766"}, want: []string{"airlock-console.airlock.svc:8766", "127.0.0.1:8766"}},
		{listen: "no-port", err: true},
		{listen: "127.0.0.1:8766", extra: []string{"no-port"}, err: true},
	} {
		h, err := ConsoleHosts(tc.listen, tc.extra)
		if (err != nil) != tc.err {
			t.Errorf("%s %v: err %v, want error %v", tc.listen, tc.extra, err, tc.err)
			continue
		}
		for _, w := range tc.want {
			if !slices.Contains(h, w) {
				t.Errorf("%s %v: %v lacks %s", tc.listen, tc.extra, h, w)
			}
		}
		for _, w := range tc.notWant {
			if slices.Contains(h, w) {
				t.Errorf("%s %v: %v has %s", tc.listen, tc.extra, h, w)
			}
		}
	}
}

func TestNewConsoleNeedsStrongToken(t *testing.T) {
	g := NewGate(Policy{Mode: ModeAlways}, 0)
	if _, err := NewConsole(g, ConsoleOptions{}); err == nil {
		t.Error("a console without tokens must not start")
	}
	if _, err := NewConsole(g, ConsoleOptions{Tokens: []Token{{"a", "short"}}}); err == nil {
		t.Error("a console with a short token must not start")
	}
}
