package tools_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// A call's secrets reach the run as placeholders only, are named in the
// question a human approves and in the audit record, and change what an
// approval covers; their values appear nowhere.
func TestSecretsInCallApprovalAndAudit(t *testing.T) {
	const value = "the-real-secret-value-9f8e"
	f := newFixture(t, "always", 10*time.Second)
	op, _ := egress.ParsePolicy([]string{"api.github.com", "pypi.org"}, nil, nil)
	secrets, err := egress.LoadSecrets([]egress.SecretSpec{{Name: "GITHUB_TOKEN", FromEnv: "X", Hosts: []string{"api.github.com"}, Header: "Authorization", Format: "Bearer {}"}},
		func(string) string { return value })
	if err != nil {
		t.Fatal(err)
	}
	f.h.Egress, f.h.Secrets, f.h.Tripwires = &op, secrets, true

	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"unknown", map[string]any{"code": "1", "network": "allowlist", "secrets": []any{"NOPE"}}, `secret "NOPE": no such secret; configured: GITHUB_TOKEN`},
		{"no network", map[string]any{"code": "1", "network": "none", "secrets": []any{"GITHUB_TOKEN"}}, `secrets need "network": "allowlist"`},
		{"not a list", map[string]any{"code": "1", "network": "allowlist", "secrets": "GITHUB_TOKEN"}, `must be an array of secret names`},
	} {
		res := raw(t, f, "alice", modernCall(t, tc.args, "", nil))
		if !res.IsError || !strings.Contains(resText(res), tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, resText(res), tc.want)
		}
	}
	args := map[string]any{"code": "print(1)", "network": "allowlist", "secrets": []any{"GITHUB_TOKEN"}}
	res := raw(t, f, "alice", modernCall(t, args, "", nil))
	if res.ResultType != mcp.ResultTypeInputRequired {
		t.Fatalf("%+v, want a question", res)
	}
	msg := res.InputRequests["airlock_approval"].Elicitation.Message
	if !strings.Contains(msg, "Secrets: GITHUB_TOKEN") || strings.Contains(msg, value) {
		t.Errorf("approval message:\n%s", msg)
	}
	// The approval covers the secrets: the same code asking for none is
	// another request, which the answer does not decide.
	without := map[string]any{"code": "print(1)", "network": "allowlist"}
	if r := raw(t, f, "alice", modernCall(t, without, res.RequestState, accept())); f.rt.count() != 0 && !r.IsError {
		t.Fatalf("an approval given for a call with secrets ran one without: %q", resText(r))
	}
	res = raw(t, f, "alice", modernCall(t, args, "", nil))
	if r := raw(t, f, "alice", modernCall(t, args, res.RequestState, accept())); r.IsError || f.rt.count() != 1 {
		t.Fatalf("approved call: %q runs=%d", resText(r), f.rt.count())
	}
	run := f.rt.runs[0]
	ph := run.Env["GITHUB_TOKEN"]
	if !strings.HasPrefix(ph, "airlock-placeholder-") || ph == value {
		t.Errorf("the run's GITHUB_TOKEN is %q, want a placeholder", ph)
	}
	if run.Env["AWS_SECRET_ACCESS_KEY"] == "" || !strings.Contains(run.HomeFiles[".netrc"], "password ") {
		t.Errorf("tripwires on, but the run has none: env %v files %v", run.Env, run.HomeFiles)
	}
	b, _ := json.Marshal(run.Env)
	if strings.Contains(string(b), value) {
		t.Error("the value is in the run's environment")
	}
	recs := f.records(t)
	last := recs[len(recs)-1]
	if strings.Join(last.Secrets, ",") != "GITHUB_TOKEN" || !last.Tripwires {
		t.Errorf("audit record secrets=%v tripwires=%v", last.Secrets, last.Tripwires)
	}
	data, _ := os.ReadFile(f.audit)
	if strings.Contains(string(data), value) || strings.Contains(string(data), ph) {
		t.Error("the audit file holds the secret's value or placeholder")
	}
}
