package tools

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode/utf8"
)

// ArgError is a problem with a tool call's arguments. Its message says what
// to change; the runtime is not touched.
type ArgError struct{ Msg string }

func (e *ArgError) Error() string { return e.Msg }

func argErrorf(format string, a ...any) error { return &ArgError{Msg: fmt.Sprintf(format, a...)} }

// RunArgs are the validated arguments of run_python and run_shell.
type RunArgs struct {
	Code    string
	Timeout int // seconds; 0 means the configured default
	// Network is "none", "allowlist" or "" (the configured default).
	Network string
	// AllowDomains narrows the operator's allow-list; nil means all of it.
	AllowDomains []string
	// SessionID runs the code in a session instead of a fresh sandbox.
	SessionID string
	// Secrets are the names of the operator's secrets the run is given
	// (as placeholders).
	Secrets []string
}

// ArgLimits bound what a call may ask for.
type ArgLimits struct {
	CodeBytes   int
	MaxTimeoutS int
}

// ParseRunArgs validates raw call arguments for a run tool whose code
// argument is named codeKey ("code" or "command").
func ParseRunArgs(tool, codeKey string, raw any, lim ArgLimits) (RunArgs, error) {
	allowed := map[string]bool{codeKey: true, "timeout_s": true, "network": true, "allow_domains": true, "session_id": true, "secrets": true}
	usage := fmt.Sprintf("%s takes {%q: string, \"timeout_s\"?: integer, \"network\"?: \"none\"|\"allowlist\", \"allow_domains\"?: [string], \"secrets\"?: [string], \"session_id\"?: string}", tool, codeKey)
	if raw == nil {
		return RunArgs{}, argErrorf("missing argument %q: %s", codeKey, usage)
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return RunArgs{}, argErrorf("arguments must be a JSON object: %s", usage)
	}
	var unknown []string
	for k := range m {
		if !allowed[k] {
			unknown = append(unknown, fmt.Sprintf("%q", k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return RunArgs{}, argErrorf("unknown argument %s: %s", strings.Join(unknown, ", "), usage)
	}

	var out RunArgs
	v, present := m[codeKey]
	if !present || v == nil {
		return RunArgs{}, argErrorf("missing argument %q: %s", codeKey, usage)
	}
	code, ok := v.(string)
	if !ok {
		return RunArgs{}, argErrorf("argument %q must be a string, got %s", codeKey, jsonType(v))
	}
	if strings.TrimSpace(code) == "" {
		return RunArgs{}, argErrorf("argument %q is empty: pass the %s to run", codeKey, map[string]string{"code": "Python code", "command": "shell command"}[codeKey])
	}
	if len(code) > lim.CodeBytes {
		return RunArgs{}, argErrorf("argument %q is %d bytes, over the limit of %d bytes (limits.code_bytes): send less code, or write data to a file in several calls", codeKey, len(code), lim.CodeBytes)
	}
	if strings.IndexByte(code, 0) >= 0 {
		return RunArgs{}, argErrorf("argument %q contains a NUL byte, which neither Python nor the shell accepts in source: remove it", codeKey)
	}
	if !utf8.ValidString(code) {
		return RunArgs{}, argErrorf("argument %q is not valid UTF-8", codeKey)
	}
	out.Code = code

	if t, present := m["timeout_s"]; present && t != nil {
		f, ok := t.(float64)
		if !ok {
			return RunArgs{}, argErrorf("argument \"timeout_s\" must be an integer number of seconds, got %s", jsonType(t))
		}
		if f != math.Trunc(f) {
			return RunArgs{}, argErrorf("argument \"timeout_s\" must be a whole number of seconds, got %v", f)
		}
		if f < 1 || f > float64(lim.MaxTimeoutS) {
			return RunArgs{}, argErrorf("argument \"timeout_s\" is %v: it must be between 1 and %d seconds (limits.max_timeout_s)", f, lim.MaxTimeoutS)
		}
		out.Timeout = int(f)
	}

	if n, present := m["network"]; present && n != nil {
		mode, ok := n.(string)
		if !ok || (mode != "none" && mode != "allowlist") {
			return RunArgs{}, argErrorf("argument \"network\" must be \"none\" or \"allowlist\", got %s", describe(n))
		}
		out.Network = mode
	}
	if d, present := m["allow_domains"]; present && d != nil {
		list, ok := d.([]any)
		if !ok {
			return RunArgs{}, argErrorf("argument \"allow_domains\" must be an array of domain names, got %s", jsonType(d))
		}
		out.AllowDomains = []string{}
		for i, item := range list {
			name, ok := item.(string)
			if !ok || name == "" {
				return RunArgs{}, argErrorf("allow_domains[%d] must be a domain name, got %s", i, describe(item))
			}
			out.AllowDomains = append(out.AllowDomains, name)
		}
		if out.Network == "none" {
			return RunArgs{}, argErrorf("allow_domains needs \"network\": \"allowlist\"; with network none the sandbox has no network")
		}
	}
	if v, present := m["secrets"]; present && v != nil {
		names, err := parseSecretNames(v)
		if err != nil {
			return RunArgs{}, err
		}
		if out.Network == "none" {
			return RunArgs{}, argErrorf("secrets need \"network\": \"allowlist\"; a secret is only ever used by the egress proxy")
		}
		out.Secrets = names
	}
	if v, present := m["session_id"]; present && v != nil {
		id, err := parseSessionID(v)
		if err != nil {
			return RunArgs{}, err
		}
		if out.Network != "" || out.AllowDomains != nil || out.Secrets != nil {
			return RunArgs{}, argErrorf("a session's network and secrets are chosen at session_create; call without \"network\", \"allow_domains\" and \"secrets\"")
		}
		out.SessionID = id
	}
	return out, nil
}

// parseSecretNames checks a secrets argument's form; which names exist is
// the secrets' own check (Handlers.credentialsFor).
func parseSecretNames(v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, argErrorf("argument \"secrets\" must be an array of secret names, got %s", jsonType(v))
	}
	names := []string{}
	for i, item := range list {
		name, ok := item.(string)
		if !ok || name == "" {
			return nil, argErrorf("secrets[%d] must be a secret's name, got %s", i, describe(item))
		}
		names = append(names, name)
	}
	return names, nil
}

// parseSessionID checks a session_id argument's form.
func parseSessionID(v any) (string, error) {
	id, ok := v.(string)
	if !ok || id == "" || len(id) > 64 {
		return "", argErrorf("argument \"session_id\" must be the id session_create returned, got %s", describe(v))
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return "", argErrorf("argument \"session_id\" %q is not a session id (session_list shows yours)", id)
		}
	}
	return id, nil
}

func describe(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return jsonType(v)
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case nil:
		return "null"
	default:
		return fmt.Sprintf("%T", v)
	}
}
