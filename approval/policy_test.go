package approval

import (
	"strings"
	"testing"
)

func TestPolicyModes(t *testing.T) {
	reqs := []Request{
		{Tool: "run_python", Code: "print(1)", Network: NetworkNone},
		{Tool: "run_shell", Code: strings.Repeat("x", 1<<20), Network: NetworkAllowlist, AllowDomains: []string{"pypi.org"}},
		{},
	}
	off, err := ParsePolicy("off", nil)
	if err != nil {
		t.Fatal(err)
	}
	always, err := ParsePolicy("always", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if ask, rule := off.Decide(r); ask || rule != RuleModeOff {
			t.Errorf("off.Decide(%s) = %v, %q; want no human", r.Tool, ask, rule)
		}
		if ask, rule := always.Decide(r); !ask || rule != RuleModeAlways {
			t.Errorf("always.Decide(%s) = %v, %q; want a human", r.Tool, ask, rule)
		}
	}
	// A hand-built policy with an unknown mode must fail closed.
	if ask, _ := (Policy{Mode: "bogus"}).Decide(reqs[0]); !ask {
		t.Errorf("unknown mode did not ask")
	}
}

func TestPolicyRules(t *testing.T) {
	// Auto-approve offline python under 10 KiB, ask for anything networked.
	p, err := ParsePolicy("rules", []RuleConfig{
		{Name: "networked", Network: "allowlist", Action: "ask"},
		{Name: "small offline python", Tool: "run_python", Network: "none", MaxCodeBytes: 10 << 10, Action: "approve"},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		req      Request
		wantAsk  bool
		wantRule string
	}{
		{"small offline python", Request{Tool: "run_python", Code: "print(1)", Network: "none"}, false, "small offline python"},
		{"exactly 10 KiB", Request{Tool: "run_python", Code: strings.Repeat("x", 10<<10), Network: "none"}, false, "small offline python"},
		{"one byte over 10 KiB", Request{Tool: "run_python", Code: strings.Repeat("x", 10<<10+1), Network: "none"}, true, RuleDefault},
		{"networked python", Request{Tool: "run_python", Code: "print(1)", Network: "allowlist"}, true, "networked"},
		{"networked shell", Request{Tool: "run_shell", Code: "curl x", Network: "allowlist"}, true, "networked"},
		{"offline shell", Request{Tool: "run_shell", Code: "ls", Network: "none"}, true, RuleDefault},
		{"unresolved network is not offline", Request{Tool: "run_python", Code: "1", Network: ""}, true, RuleDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ask, rule := p.Decide(tt.req)
			if ask != tt.wantAsk || rule != tt.wantRule {
				t.Errorf("Decide = %v, %q; want %v, %q", ask, rule, tt.wantAsk, tt.wantRule)
			}
		})
	}
}

func TestPolicyFirstMatchWins(t *testing.T) {
	p, err := ParsePolicy("rules", []RuleConfig{
		{Tool: "run_python", Action: "approve"},
		{Action: "ask"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ask, rule := p.Decide(Request{Tool: "run_python", Network: "allowlist"}); ask || rule != "rules[0]" {
		t.Errorf("Decide = %v, %q; want the first rule (unnamed → rules[0]) to approve", ask, rule)
	}
	if ask, rule := p.Decide(Request{Tool: "run_shell"}); !ask || rule != "rules[1]" {
		t.Errorf("Decide = %v, %q; want the catch-all rules[1] to ask", ask, rule)
	}
	minRule, err := ParsePolicy("rules", []RuleConfig{{Name: "big", MinCodeBytes: 100, Action: "ask"}, {Action: "approve"}})
	if err != nil {
		t.Fatal(err)
	}
	if ask, rule := minRule.Decide(Request{Code: strings.Repeat("x", 100)}); !ask || rule != "big" {
		t.Errorf("100-byte code: Decide = %v, %q; want min_code_bytes rule to ask", ask, rule)
	}
	if ask, _ := minRule.Decide(Request{Code: strings.Repeat("x", 99)}); ask {
		t.Errorf("99-byte code matched min_code_bytes 100")
	}
}

func TestParsePolicyErrors(t *testing.T) {
	tests := []struct {
		name  string
		mode  string
		rules []RuleConfig
		want  string
	}{
		{"bad mode", "sometimes", nil, `approval.mode: "sometimes" is not one of`},
		{"empty mode", "", nil, `approval.mode: ""`},
		{"rules without rules mode", "always", []RuleConfig{{Action: "ask"}}, "approval.rules: 1 rules given but approval.mode is \"always\""},
		{"missing action", "rules", []RuleConfig{{Name: "r1"}}, "approval.rules[0] (r1).action: missing"},
		{"bad action", "rules", []RuleConfig{{Action: "ask"}, {Action: "allow"}}, `approval.rules[1].action: "allow" is not one of approve, ask`},
		{"bad network", "rules", []RuleConfig{{Network: "internet", Action: "ask"}}, `approval.rules[0].network: "internet"`},
		{"negative min", "rules", []RuleConfig{{MinCodeBytes: -1, Action: "ask"}}, "approval.rules[0].min_code_bytes: -1 is negative"},
		{"negative max", "rules", []RuleConfig{{MaxCodeBytes: -1, Action: "ask"}}, "approval.rules[0].max_code_bytes: -1 is negative"},
		{"min above max", "rules", []RuleConfig{{MinCodeBytes: 10, MaxCodeBytes: 5, Action: "ask"}}, "approval.rules[0].min_code_bytes: 10 is above max_code_bytes 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePolicy(tt.mode, tt.rules)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParsePolicy err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParsePolicyEmptyRulesAsk(t *testing.T) {
	p, err := ParsePolicy("rules", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ask, rule := p.Decide(Request{Tool: "run_python", Network: "none"}); !ask || rule != RuleDefault {
		t.Errorf("no rules: Decide = %v, %q; want ask by default", ask, rule)
	}
}
