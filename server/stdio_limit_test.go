package server

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll reads everything through a limiter of max bytes fed in small
// reads, and returns what passed and what was answered.
func readAll(t *testing.T, in string, max int) (passed, answered string) {
	t.Helper()
	var out bytes.Buffer
	l := newLineLimiter(iotest.HalfReader(strings.NewReader(in)), max, &out)
	b, err := io.ReadAll(l)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), out.String()
}

func TestLineLimiter(t *testing.T) {
	big := `{"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"code":"` + strings.Repeat("x", 5000) + `","id":99}},"id":7}`
	tests := []struct {
		name     string
		in       string
		passed   string
		answered []string // ids of the refusals, in order
	}{
		{"small messages pass", "{\"id\":1}\n{\"id\":2}\n", "{\"id\":1}\n{\"id\":2}\n", nil},
		{"last message without newline passes", "{\"id\":1}", "{\"id\":1}", nil},
		{"exactly max passes", strings.Repeat("a", 100) + "\n", strings.Repeat("a", 100) + "\n", nil},
		{"one over max is refused", strings.Repeat("a", 101) + "\n", "", []string{"null"}},
		{"big message refused with its top-level id, the next one read", big + "\n{\"id\":3}\n", "{\"id\":3}\n", []string{"7"}},
		{"string id", `{"id":"req-\"1\"","params":{"x":"` + strings.Repeat("y", 300) + "\"}}\n", "", []string{`"req-\"1\""`}},
		{"id first, nested id ignored", `{"id":-5,"params":{"id":1,"x":"` + strings.Repeat("y", 300) + "\"}}\n", "", []string{"-5"}},
		{"two big in a row", big + "\n" + big + "\n", "", []string{"7", "7"}},
		{"not JSON", strings.Repeat("{[\"", 200) + "\n{\"id\":4}\n", "{\"id\":4}\n", []string{"null"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			passed, answered := readAll(t, tc.in, 100)
			if passed != tc.passed {
				t.Errorf("passed %q, want %q", passed, tc.passed)
			}
			var ids []string
			for _, line := range strings.Split(strings.TrimSpace(answered), "\n") {
				if line == "" {
					continue
				}
				var m struct {
					ID    json.RawMessage `json:"id"`
					Error struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("refusal %q is not JSON: %v", line, err)
				}
				if m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "at most 100 bytes") {
					t.Errorf("refusal %q", line)
				}
				ids = append(ids, string(m.ID))
			}
			if strings.Join(ids, ",") != strings.Join(tc.answered, ",") {
				t.Errorf("refused ids %v, want %v", ids, tc.answered)
			}
		})
	}
}

// A message far over the bound is never held: the limiter's memory stays
// at its read buffer while 64 MiB stream through.
func TestLineLimiterDoesNotHold(t *testing.T) {
	var out bytes.Buffer
	src := io.MultiReader(strings.NewReader(`{"id":1,"x":"`), io.LimitReader(zeros{}, 64<<20), strings.NewReader("\"}\n{\"id\":2}\n"))
	l := newLineLimiter(src, 1<<20, &out)
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := l.Read(buf)
		got.Write(buf[:n])
		if cap(l.line) > 2<<20 {
			t.Fatalf("limiter holds %d bytes", cap(l.line))
		}
		if err != nil {
			break
		}
	}
	if got.String() != "{\"id\":2}\n" || !strings.Contains(out.String(), `"id":1`) {
		t.Errorf("passed %q, answered %q", got.String(), out.String())
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

func FuzzIDScanner(f *testing.F) {
	for _, s := range []string{`{"id":1}`, `{"a":{"id":2},"id":"x\"y"}`, `{"id":-1.5e3,"b":[1,{"id":3}]}`, `[{"id":1}]`, `{"id":"` + strings.Repeat("z", 300) + `"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var sc idScanner
		sc.feed([]byte(s))
		if sc.value == nil {
			return
		}
		// Whatever it found is valid JSON, short, and for a valid message,
		// the message's own top-level id.
		if !json.Valid(sc.value) || len(sc.value) > maxID {
			t.Fatalf("id %q from %q", sc.value, s)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &m) == nil {
			if id, ok := m["id"]; ok && !bytes.Equal(bytes.TrimSpace(id), sc.value) && !strings.Contains(s, `\`) {
				var a, b any
				_ = json.Unmarshal(id, &a)
				_ = json.Unmarshal(sc.value, &b)
				if a != b {
					t.Fatalf("id %s, message's id %s: %q", sc.value, id, s)
				}
			}
		}
	})
}
