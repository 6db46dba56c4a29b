package egress

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
)

// systemCABundle is Debian's trust store, the base of a custom CA bundle.
const systemCABundle = "/etc/ssl/certs/ca-certificates.crt"

// Settings are the operator's network settings as written (network.* in
// the config), for either backend's proxy.
type Settings struct {
	Domains []string
	Ports   []int
	CIDRs   []string
	// Hosts pins names to addresses (network.hosts).
	Hosts map[string][]string
	// AllowPrivate exempts prefixes from the private-address refusal.
	AllowPrivate []string
	// CAFile is a PEM bundle sandboxes trust beside the system's.
	CAFile string
	// Allow are network.allow's rules.
	Allow []AllowRule
	// Secrets are the top-level secrets entries.
	Secrets []SecretSpec
	// Tripwires is network.tripwires.
	Tripwires bool
	// StateDir holds the interception CA, created when first needed.
	StateDir string
	Logger   *slog.Logger
}

// Stack is a proxy built from Settings, not yet listening: the
// operator's policy, the server, and the CA bundle sandboxes get (nil
// without network.ca_file).
type Stack struct {
	Policy   Policy
	Proxy    *Server
	CABundle []byte
	// Secrets are the loaded secrets (nil when none are configured);
	// Tripwires says every networked run gets them.
	Secrets   *Secrets
	Tripwires bool
}

// FromSettings parses the settings and builds the proxy, naming the
// setting at fault on error.
func FromSettings(s Settings) (Stack, error) {
	pol, err := ParsePolicy(s.Domains, s.Ports, s.CIDRs)
	if err != nil {
		return Stack{}, fmt.Errorf("network.allow_domains/allow_ports/allow_cidrs: %w", err)
	}
	if pol, err = pol.WithRules(s.Allow); err != nil {
		return Stack{}, err
	}
	var secrets *Secrets
	if len(s.Secrets) > 0 {
		if secrets, err = LoadSecrets(s.Secrets, os.Getenv); err != nil {
			return Stack{}, err
		}
		for _, name := range secrets.Names() {
			for _, h := range secrets.Hosts(name) {
				if ok, _ := pol.Covers(h); !ok {
					return Stack{}, fmt.Errorf("secrets (%s): host %q is not in network.allow_domains or network.allow, so the secret could never be sent: add it there", name, h)
				}
			}
		}
	}
	hosts := map[string][]netip.Addr{}
	for name, addrs := range s.Hosts {
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return Stack{}, fmt.Errorf("network.hosts %s: %w", name, err)
			}
			hosts[name] = append(hosts[name], ip)
		}
	}
	var private []netip.Prefix
	for _, p := range s.AllowPrivate {
		pp, err := netip.ParsePrefix(p)
		if err != nil {
			return Stack{}, fmt.Errorf("network.allow_private: %w", err)
		}
		private = append(private, pp)
	}
	var bundle, extra []byte
	var roots *x509.CertPool
	if s.CAFile != "" {
		if extra, err = os.ReadFile(s.CAFile); err != nil {
			return Stack{}, fmt.Errorf("network.ca_file: %w", err)
		}
		system, _ := os.ReadFile(systemCABundle)
		bundle = append(append(system, '\n'), extra...)
		// Intercepted hosts are verified as the sandbox would verify them.
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(extra) {
			return Stack{}, fmt.Errorf("network.ca_file %s: no PEM certificate in it", s.CAFile)
		}
	}
	// The CA exists only where something needs interception, so a plain
	// allow-list keeps blind tunnels and an unchanged trust store.
	var ca *CA
	if pol.anyL7() || secrets != nil || s.Tripwires {
		if s.StateDir == "" {
			return Stack{}, errors.New("network.allow rules, secrets and network.tripwires need state_dir for the interception CA")
		}
		if ca, err = LoadOrCreateCA(s.StateDir); err != nil {
			return Stack{}, err
		}
		if bundle == nil {
			system, _ := os.ReadFile(systemCABundle)
			bundle = system
		}
		bundle = append(append(bundle, '\n'), ca.CertPEM()...)
	}
	proxy, err := New(Options{Hosts: hosts, AllowedPrivate: private, Logger: s.Logger, CA: ca, UpstreamRoots: roots})
	if err != nil {
		return Stack{}, err
	}
	return Stack{Policy: pol, Proxy: proxy, CABundle: bundle, Secrets: secrets, Tripwires: s.Tripwires}, nil
}
