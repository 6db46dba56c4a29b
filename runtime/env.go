package runtime

import (
	"sort"
)

// baseEnv is the whole environment of a sandbox before the operator's
// additions. It is built from this list, never from the server's environment.
var baseEnv = map[string]string{
	"PATH":                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME":                    "/workspace",
	"TMPDIR":                  "/tmp",
	"LANG":                    "C.UTF-8",
	"LC_ALL":                  "C.UTF-8",
	"PYTHONDONTWRITEBYTECODE": "1",
	"MPLBACKEND":              "Agg",
	"MPLCONFIGDIR":            "/tmp/matplotlib",
	"OPENBLAS_NUM_THREADS":    "1",
}

// BuildEnv returns the sandbox environment as KEY=VALUE lines, sorted: the
// base list overlaid with extra (the operator's sandbox.env).
func BuildEnv(extra map[string]string) []string {
	m := make(map[string]string, len(baseEnv)+len(extra))
	for k, v := range baseEnv {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
