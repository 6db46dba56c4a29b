package approval

import (
	"fmt"
	"strings"
)

// Mode selects how the gate decides whether a human must look at a run.
type Mode string

// The modes: off lets every run through (trusted single-user setups),
// always asks for every run, rules consults the rule list.
const (
	ModeOff    Mode = "off"
	ModeAlways Mode = "always"
	ModeRules  Mode = "rules"
)

// Action is what a matching rule does.
type Action string

// ActionApprove lets the run through without a human; ActionAsk asks one.
const (
	ActionApprove Action = "approve"
	ActionAsk     Action = "ask"
)

// Networks a rule may name; they mirror the tool argument "network".
const (
	NetworkNone      = "none"
	NetworkAllowlist = "allowlist"
)

// RuleConfig is a rule as written in the configuration file; ParsePolicy
// checks it and turns it into a Rule.
type RuleConfig struct {
	Name         string `mapstructure:"name" json:"name" yaml:"name"`
	Tool         string `mapstructure:"tool" json:"tool" yaml:"tool"`
	Network      string `mapstructure:"network" json:"network" yaml:"network"`
	MinCodeBytes int    `mapstructure:"min_code_bytes" json:"min_code_bytes" yaml:"min_code_bytes"`
	MaxCodeBytes int    `mapstructure:"max_code_bytes" json:"max_code_bytes" yaml:"max_code_bytes"`
	Action       string `mapstructure:"action" json:"action" yaml:"action"`
}

// Rule matches requests; every condition set must hold. Empty strings and
// zero sizes mean "any", so a rule with no conditions matches everything.
type Rule struct {
	// Name identifies the rule in decisions and the audit log.
	Name string
	// Tool is the tool name to match, "" for any.
	Tool string
	// Network is "none" or "allowlist", "" for any.
	Network string
	// MinCodeBytes matches code of at least this many bytes, 0 for any.
	MinCodeBytes int
	// MaxCodeBytes matches code of at most this many bytes, 0 for any.
	MaxCodeBytes int
	// Action is applied when the rule matches.
	Action Action
}

// matches reports whether every condition of r holds for req.
func (r Rule) matches(req Request) bool {
	n := len(req.Code)
	return (r.Tool == "" || r.Tool == req.Tool) &&
		(r.Network == "" || r.Network == req.Network) &&
		(r.MinCodeBytes == 0 || n >= r.MinCodeBytes) &&
		(r.MaxCodeBytes == 0 || n <= r.MaxCodeBytes)
}

// Policy decides, without any I/O, whether a request needs a human.
type Policy struct {
	Mode  Mode
	Rules []Rule
}

// Rule names Decide reports when no configured rule decided.
const (
	RuleModeOff    = "mode off"
	RuleModeAlways = "mode always"
	RuleDefault    = "default"
)

// Decide reports whether req needs a human and which rule said so. Rules
// are tried in order and the first match wins; when none matches the answer
// is to ask, so a gap in the rules fails closed.
func (p Policy) Decide(req Request) (needsHuman bool, rule string) {
	switch p.Mode {
	case ModeOff:
		return false, RuleModeOff
	case ModeRules:
		for _, r := range p.Rules {
			if r.matches(req) {
				return r.Action != ActionApprove, r.Name
			}
		}
		return true, RuleDefault
	default:
		// ModeAlways, and any mode a caller built by hand without
		// ParsePolicy: asking is the safe answer.
		return true, RuleModeAlways
	}
}

// ParsePolicy checks a mode and its rules from configuration. Errors name
// the rule and field at fault so the user can fix the file.
func ParsePolicy(mode string, rules []RuleConfig) (Policy, error) {
	m := Mode(strings.TrimSpace(mode))
	switch m {
	case ModeOff, ModeAlways, ModeRules:
	default:
		return Policy{}, fmt.Errorf("approval.mode: %q is not one of off, always, rules", mode)
	}
	if m != ModeRules && len(rules) > 0 {
		return Policy{}, fmt.Errorf("approval.rules: %d rules given but approval.mode is %q; set mode to rules or remove them", len(rules), m)
	}
	p := Policy{Mode: m}
	for i, rc := range rules {
		r, err := parseRule(rc)
		where := fmt.Sprintf("approval.rules[%d]", i)
		if rc.Name != "" {
			where += fmt.Sprintf(" (%s)", rc.Name)
		}
		if err != nil {
			return Policy{}, fmt.Errorf("%s.%w", where, err)
		}
		if r.Name == "" {
			r.Name = fmt.Sprintf("rules[%d]", i)
		}
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

// parseRule checks one rule; its errors start with the field name so
// ParsePolicy can prefix the rule's position.
func parseRule(rc RuleConfig) (Rule, error) {
	r := Rule{
		Name:         rc.Name,
		Tool:         rc.Tool,
		Network:      rc.Network,
		MinCodeBytes: rc.MinCodeBytes,
		MaxCodeBytes: rc.MaxCodeBytes,
		Action:       Action(rc.Action),
	}
	switch r.Action {
	case ActionApprove, ActionAsk:
	case "":
		return Rule{}, fmt.Errorf("action: missing; set approve or ask")
	default:
		return Rule{}, fmt.Errorf("action: %q is not one of approve, ask", rc.Action)
	}
	switch r.Network {
	case "", NetworkNone, NetworkAllowlist:
	default:
		return Rule{}, fmt.Errorf("network: %q is not one of none, allowlist (or empty for any)", rc.Network)
	}
	if r.MinCodeBytes < 0 {
		return Rule{}, fmt.Errorf("min_code_bytes: %d is negative", r.MinCodeBytes)
	}
	if r.MaxCodeBytes < 0 {
		return Rule{}, fmt.Errorf("max_code_bytes: %d is negative", r.MaxCodeBytes)
	}
	if r.MaxCodeBytes != 0 && r.MinCodeBytes > r.MaxCodeBytes {
		return Rule{}, fmt.Errorf("min_code_bytes: %d is above max_code_bytes %d, so the rule never matches", r.MinCodeBytes, r.MaxCodeBytes)
	}
	return r, nil
}
