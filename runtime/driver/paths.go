package driver

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// Path limits of file operations.
const (
	MaxPathBytes      = 1024
	MaxComponentBytes = 255
)

// ErrBadPath is wrapped by every refusal of CheckPath.
var ErrBadPath = errors.New("bad path")

// CheckPath validates a path given to a file operation and returns its
// clean components. Paths are relative to /workspace: absolute paths, ".."
// anywhere, NUL bytes, invalid UTF-8 and over-long paths are refused, so
// the path means the same to the caller, the host and the sandbox. An
// empty path (or ".") names /workspace itself, which only a listing may.
func CheckPath(p string, allowRoot bool) ([]string, error) {
	bad := func(why string) ([]string, error) {
		return nil, fmt.Errorf("%w %q: %s", ErrBadPath, p, why)
	}
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return bad("contains a NUL byte")
	case !utf8.ValidString(p):
		return bad("is not valid UTF-8")
	case len(p) > MaxPathBytes:
		return bad(fmt.Sprintf("is longer than %d bytes", MaxPathBytes))
	case strings.HasPrefix(p, "/"):
		return bad("is absolute; give a path relative to /workspace, such as data/input.csv")
	}
	var parts []string
	for _, c := range strings.Split(p, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return bad(`contains ".."; paths stay inside /workspace`)
		case len(c) > MaxComponentBytes:
			return bad(fmt.Sprintf("has a component longer than %d bytes", MaxComponentBytes))
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 && !allowRoot {
		return bad("names /workspace itself; name a file in it")
	}
	if path.Join(parts...) != strings.Join(parts, "/") {
		return bad("is not a clean path")
	}
	return parts, nil
}
