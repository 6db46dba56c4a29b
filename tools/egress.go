package tools

import (
	"errors"
	"fmt"
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

// credentialsFor binds a networked call's secrets and, when they are on,
// its tripwires, and returns pol carrying them into the proxy. A call
// without a network gets neither; asking for secrets then is an error.
func (h *Handlers) credentialsFor(names []string, pol *egress.Policy) (*egress.Policy, *egress.Credentials, error) {
	if pol == nil {
		if len(names) > 0 {
			return nil, nil, argErrorf("secrets need \"network\": \"allowlist\"; a secret is only ever used by the egress proxy")
		}
		return nil, nil, nil
	}
	if len(names) == 0 && !h.Tripwires {
		return pol, nil, nil
	}
	creds, err := h.Secrets.Bind(names)
	if err != nil {
		return nil, nil, argErrorf("secrets: %v", err)
	}
	if h.Tripwires {
		creds.AddTripwires()
	}
	p := pol.WithCredentials(creds)
	return &p, creds, nil
}

// secretsDescription tells a model what the secrets argument does.
func (h *Handlers) secretsDescription() string {
	var b strings.Builder
	b.WriteString("With network allowlist: operator secrets this run needs, by name. The sandbox gets each as an environment variable holding a placeholder, never the value; the egress proxy puts the value into HTTPS requests to that secret's hosts only (and a request carrying it anywhere else is refused). Available:")
	for _, n := range h.Secrets.Names() {
		fmt.Fprintf(&b, " %s (for %s);", n, strings.Join(h.Secrets.Hosts(n), ", "))
	}
	return strings.TrimSuffix(b.String(), ";") + "."
}
