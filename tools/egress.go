package tools

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// EgressFor returns a call's egress policy: nil for no network, else the
// operator's list narrowed by the call's allow_domains. grants are the
// requested domains outside the operator's list that approval.grantable_domains
// covers: the run may have them only if a human approves this call.
func (h *Handlers) EgressFor(a RunArgs) (pol *egress.Policy, grants []string, err error) {
	mode := a.Network
	if mode == "" {
		mode = h.defaultNetwork()
	}
	if mode != config.NetworkAllowlist {
		return nil, nil, nil
	}
	if h.Egress == nil {
		return nil, nil, argErrorf("this server offers no network: the operator has not set network.allow_domains; run without \"network\"")
	}
	if a.AllowDomains == nil {
		p := *h.Egress
		return &p, nil, nil
	}
	var inside, refused []string
	for _, d := range a.AllowDomains {
		ok, err := h.Egress.Covers(d)
		if err != nil {
			return nil, nil, argErrorf("allow_domains: %v", errors.Unwrap(err))
		}
		switch {
		case ok:
			inside = append(inside, d)
		case h.Grantable != nil && h.grantable(d):
			grants = append(grants, d)
		default:
			refused = append(refused, strconv.Quote(d))
		}
	}
	if len(refused) > 0 {
		msg := "allow_domains: " + strings.Join(refused, ", ") + " not covered by the operator's allow-list; the operator allows: " + listOrNone(h.Egress.Domains())
		if h.Grantable != nil {
			msg += "; an approver may grant: " + listOrNone(h.Grantable.Domains())
		}
		return nil, nil, argErrorf("%s", msg)
	}
	p, err := h.Egress.Narrow(inside)
	if err != nil {
		return nil, nil, argErrorf("allow_domains: %v", err)
	}
	if len(grants) > 0 {
		slices.Sort(grants)
		grants = slices.Compact(grants)
		if p, err = p.Widen(grants); err != nil {
			return nil, nil, argErrorf("allow_domains: %v", err)
		}
	}
	return &p, grants, nil
}

func (h *Handlers) grantable(d string) bool {
	ok, err := h.Grantable.Covers(d)
	return err == nil && ok
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "(none)"
	}
	return strings.Join(l, ", ")
}

func (h *Handlers) defaultNetwork() string {
	if h.DefaultNetwork == "" {
		return config.NetworkNone
	}
	return h.DefaultNetwork
}
