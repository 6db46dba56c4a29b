package tools

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseRunArgs(t *testing.T) {
	lim := ArgLimits{CodeBytes: 100, MaxTimeoutS: 300}
	cases := []struct {
		name    string
		raw     any
		wantErr string // substring; empty means valid
		want    RunArgs
	}{
		{"ok", map[string]any{"code": "print(1)"}, "", RunArgs{Code: "print(1)"}},
		{"ok timeout", map[string]any{"code": "x", "timeout_s": float64(2)}, "", RunArgs{Code: "x", Timeout: 2}},
		{"null timeout is default", map[string]any{"code": "x", "timeout_s": nil}, "", RunArgs{Code: "x"}},
		{"no arguments", nil, `missing argument "code"`, RunArgs{}},
		{"not an object", []any{"x"}, "must be a JSON object", RunArgs{}},
		{"missing code", map[string]any{"timeout_s": float64(1)}, `missing argument "code"`, RunArgs{}},
		{"empty code", map[string]any{"code": ""}, "is empty", RunArgs{}},
		{"blank code", map[string]any{"code": "  \n"}, "is empty", RunArgs{}},
		{"code wrong type", map[string]any{"code": float64(3)}, "must be a string, got a number", RunArgs{}},
		{"code too big", map[string]any{"code": strings.Repeat("x", 101)}, "over the limit of 100 bytes", RunArgs{}},
		{"nul byte", map[string]any{"code": "a\x00b"}, "NUL byte", RunArgs{}},
		{"unknown field", map[string]any{"code": "x", "approved": true}, `unknown argument "approved"`, RunArgs{}},
		{"timeout string", map[string]any{"code": "x", "timeout_s": "5"}, "must be an integer", RunArgs{}},
		{"timeout fraction", map[string]any{"code": "x", "timeout_s": 1.5}, "whole number", RunArgs{}},
		{"timeout zero", map[string]any{"code": "x", "timeout_s": float64(0)}, "between 1 and 300", RunArgs{}},
		{"timeout over max", map[string]any{"code": "x", "timeout_s": float64(301)}, "between 1 and 300", RunArgs{}},
		{"network allowlist", map[string]any{"code": "x", "network": "allowlist", "allow_domains": []any{"pypi.org"}}, "", RunArgs{Code: "x", Network: "allowlist", AllowDomains: []string{"pypi.org"}}},
		{"network bad value", map[string]any{"code": "x", "network": "internet"}, `"network" must be "none" or "allowlist", got "internet"`, RunArgs{}},
		{"allow_domains not array", map[string]any{"code": "x", "allow_domains": "pypi.org"}, "must be an array", RunArgs{}},
		{"allow_domains bad item", map[string]any{"code": "x", "allow_domains": []any{"a", 3.0}}, "allow_domains[1] must be a domain name", RunArgs{}},
		{"allow_domains with network none", map[string]any{"code": "x", "network": "none", "allow_domains": []any{"a.org"}}, `needs "network": "allowlist"`, RunArgs{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRunArgs("run_python", "code", c.raw, lim)
			if c.wantErr == "" {
				if err != nil || !reflect.DeepEqual(got, c.want) {
					t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			var ae *ArgError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want an ArgError containing %q", err, c.wantErr)
			}
		})
	}
}

func TestParseRunArgsShellKey(t *testing.T) {
	if _, err := ParseRunArgs("run_shell", "command", map[string]any{"code": "ls"}, ArgLimits{CodeBytes: 10, MaxTimeoutS: 5}); err == nil ||
		!strings.Contains(err.Error(), `unknown argument "code"`) || !strings.Contains(err.Error(), `"command": string`) {
		t.Fatalf("err = %v; want it to name the right argument", err)
	}
}
