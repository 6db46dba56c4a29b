package egress

import (
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
	Logger *slog.Logger
}

// Stack is a proxy built from Settings, not yet listening: the
// operator's policy, the server, and the CA bundle sandboxes get (nil
// without network.ca_file).
type Stack struct {
	Policy   Policy
	Proxy    *Server
	CABundle []byte
}

// FromSettings parses the settings and builds the proxy, naming the
// setting at fault on error.
func FromSettings(s Settings) (Stack, error) {
	pol, err := ParsePolicy(s.Domains, s.Ports, s.CIDRs)
	if err != nil {
		return Stack{}, fmt.Errorf("network.allow_domains/allow_ports/allow_cidrs: %w", err)
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
	var ca []byte
	if s.CAFile != "" {
		extra, err := os.ReadFile(s.CAFile)
		if err != nil {
			return Stack{}, fmt.Errorf("network.ca_file: %w", err)
		}
		system, _ := os.ReadFile(systemCABundle)
		ca = append(append(system, '\n'), extra...)
	}
	proxy, err := New(Options{Hosts: hosts, AllowedPrivate: private, Logger: s.Logger})
	if err != nil {
		return Stack{}, err
	}
	return Stack{Policy: pol, Proxy: proxy, CABundle: ca}, nil
}
