package driver

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// ErrBadEnv is wrapped by every refusal of CheckEnv.
var ErrBadEnv = errors.New("bad environment variable")

// ErrBadHomeFile is wrapped by every refusal of CheckHomeFile.
var ErrBadHomeFile = errors.New("bad home file name")

// MaxEnvBytes bounds a run's extra environment, names and values together:
// a shell run's whole environment must fit exec's limits, and a clear
// refusal beats the child's "argument list too long".
const MaxEnvBytes = 128 << 10

// CheckEnv validates a run's extra environment (Work.Env). Each name must
// be one a shell can set, [A-Za-z_][A-Za-z0-9_]*, so it means the same to
// bash, Python and exec, and can hold no '=' or NUL. Values must be valid
// UTF-8 (the frame is JSON, which would replace other bytes) without NUL
// bytes (exec cuts the string there). Names are checked in sorted order,
// so the refusal is the same from one call to the next.
func CheckEnv(env map[string]string) error {
	names := make([]string, 0, len(env))
	total := 0
	for k, v := range env {
		names = append(names, k)
		total += len(k) + len(v) + 2 // "=" and the terminating NUL
	}
	sort.Strings(names)
	for _, k := range names {
		if !validEnvName(k) {
			return fmt.Errorf("%w: name %q: use letters, digits and '_', not starting with a digit", ErrBadEnv, k)
		}
		v := env[k]
		switch {
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("%w: %s: the value contains a NUL byte", ErrBadEnv, k)
		case !utf8.ValidString(v):
			return fmt.Errorf("%w: %s: the value is not valid UTF-8", ErrBadEnv, k)
		}
	}
	if total > MaxEnvBytes {
		return fmt.Errorf("%w: %d bytes of names and values, more than %d", ErrBadEnv, total, MaxEnvBytes)
	}
	return nil
}

// validEnvName reports whether s is [A-Za-z_][A-Za-z0-9_]*.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// CheckHomeFile validates the name of a file written into the code user's
// home (Work.HomeFiles): a base name such as ".netrc", so the file lands
// in /workspace itself and nowhere else. "/", "." and "..", NUL bytes,
// invalid UTF-8 and names longer than MaxComponentBytes are refused.
func CheckHomeFile(name string) error {
	parts, err := CheckPath(name, false)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrBadHomeFile, err)
	case len(parts) != 1 || parts[0] != name:
		return fmt.Errorf("%w %q: give a base name, such as .netrc, with no '/'", ErrBadHomeFile, name)
	}
	return nil
}

// checkHomeFiles checks every name of files, in sorted order.
func checkHomeFiles(files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := CheckHomeFile(name); err != nil {
			return err
		}
	}
	return nil
}

// overlayEnv is base with env's variables added, each replacing any of
// base's of the same name: exec would take whichever came first.
func overlayEnv(base []string, env map[string]string) []string {
	if len(env) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(env))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, replaced := env[name]; !replaced {
			out = append(out, kv)
		}
	}
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		out = append(out, k+"="+env[k])
	}
	return out
}
