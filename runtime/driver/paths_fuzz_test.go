package driver

import (
	"errors"
	"path"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCheckPath checks that a path CheckPath accepts means one place inside
// /workspace, the same to every reader: relative, clean, no "..", no NUL,
// valid UTF-8, within the length bounds.
//
//	go test -run '^$' -fuzz '^FuzzCheckPath$' -fuzztime 5m ./runtime/driver
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"data/in.csv", "../etc/passwd", "/etc/passwd", "a/./b//c", "a/../b", "", ".", "a\x00b", "\xff", strings.Repeat("x/", 600)} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, p string, allowRoot bool) {
		parts, err := CheckPath(p, allowRoot)
		if err != nil {
			if !errors.Is(err, ErrBadPath) {
				t.Fatalf("refusal %v does not wrap ErrBadPath", err)
			}
			return
		}
		if len(parts) == 0 && !allowRoot {
			t.Fatalf("%q names the workspace itself", p)
		}
		if len(p) > MaxPathBytes || !utf8.ValidString(p) || strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") {
			t.Fatalf("accepted %q", p)
		}
		for _, c := range parts {
			if c == "" || c == "." || c == ".." || strings.Contains(c, "/") || len(c) > MaxComponentBytes {
				t.Fatalf("%q: component %q", p, c)
			}
		}
		joined := path.Join(append([]string{Workspace}, parts...)...)
		if joined != Workspace && !strings.HasPrefix(joined, Workspace+"/") {
			t.Fatalf("%q resolves to %q, outside %s", p, joined, Workspace)
		}
	})
}
