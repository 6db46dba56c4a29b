package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
)

// registered is every tool airlock serves, by name, as tools/list sends it.
func registered(t *testing.T) map[string]map[string]any {
	t.Helper()
	s := server.NewMCPServer("airlock", "test")
	cfg := config.Defaults()
	h := &Handlers{Manager: &sessionless{}, Limits: cfg.Limits, Sessions: cfg.Sessions, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h.Register(s)
	t.Cleanup(h.Close)
	out := map[string]map[string]any{}
	for name, st := range s.ListTools() {
		b, err := json.Marshal(st.Tool)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = m
	}
	return out
}

// sessionless offers sessions, so that every tool is registered; the
// schema tests open none.
type sessionless struct{ countingManager }

func (*sessionless) OpenSession(context.Context, runtime.SessionOptions) (runtime.Session, error) {
	return nil, errors.New("no sessions in a schema test")
}

// typeArrays lists the paths in a schema whose "type" is an array.
func typeArrays(node any, path string, found *[]string) {
	switch n := node.(type) {
	case map[string]any:
		for k, v := range n {
			if _, ok := v.([]any); ok && k == "type" {
				*found = append(*found, fmt.Sprintf("%s.type = %v", path, v))
			}
			typeArrays(v, path+"."+k, found)
		}
	case []any:
		for i, v := range n {
			typeArrays(v, fmt.Sprintf("%s[%d]", path, i), found)
		}
	}
}

// Clients that map schemas onto a single-type dialect reject a "type"
// that is a list (the Inspector's --strict check warns of each).
func TestSchemasHaveOneTypeEach(t *testing.T) {
	tools := registered(t)
	for _, name := range []string{"run_python", "run_shell", "list_files", "list_runs", "session_create", "session_list"} {
		if _, ok := tools[name]["outputSchema"]; !ok {
			t.Errorf("tool %s has no output schema", name)
		}
	}
	for name, tool := range tools {
		var found []string
		typeArrays(tool, name, &found)
		for _, f := range found {
			t.Errorf("%s", f)
		}
	}
}

// What a tool returns matches its output schema even when every list in
// it is empty: required lists are [], optional ones absent, never null.
func TestEmptyResultsMatchTheirSchemas(t *testing.T) {
	tools := registered(t)
	cases := map[string]any{
		"run_python":     RunOutput{},
		"run_shell":      RunOutput{},
		"write_file":     WriteFileOutput{},
		"read_file":      ReadFileOutput{},
		"list_files":     ListFilesOutput{},
		"list_runs":      ListRunsOutput{Runs: []RunInfo{{}}},
		"session_create": SessionInfo{},
		"session_list":   SessionList{Sessions: []SessionInfo{{}}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(tools[name]["outputSchema"])
			if err != nil {
				t.Fatal(err)
			}
			var schema jsonschema.Schema
			if err := json.Unmarshal(raw, &schema); err != nil {
				t.Fatalf("output schema: %v", err)
			}
			resolved, err := schema.Resolve(nil)
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			b, _ := json.Marshal(structured(v, "").StructuredContent)
			var got any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if err := resolved.Validate(got); err != nil {
				t.Errorf("%s: %v\nresult: %s", name, err, b)
			}
			// Without structured's care, the same value would not match.
			bare, _ := json.Marshal(v)
			var bareGot any
			_ = json.Unmarshal(bare, &bareGot)
			if name == "list_files" && resolved.Validate(bareGot) == nil {
				t.Errorf("a nil list validated against the schema: the test proves nothing")
			}
		})
	}
}
