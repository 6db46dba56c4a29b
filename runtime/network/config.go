// Package network gives each sandbox of the "allowlist" egress mode its own
// network namespace on a private Linux bridge, and fences that bridge off with
// nftables so a sandbox can reach exactly one thing: the egress proxy
// listening on the bridge's gateway address.
//
// Order matters and is enforced: the firewall (EnsureFirewall) must be in
// place before Attach gives any namespace an address; Attach refuses to run
// otherwise. The sandbox gets an address on the bridge subnet and NO default
// route, the proxy being on-link; the firewall drops everything else from the
// subnet to the host, everything forwarded from or to the bridge, every frame
// bridged between two sandboxes, and all IPv6. No NAT is ever set up.
//
// The Linux implementation is in *_linux.go; elsewhere only Config builds.
package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
)

// Defaults of Config.
const (
	DefaultBridge    = "airlock0"
	DefaultProxyPort = 3128
	// DefaultProxyPorts is the number of proxy ports, one per instance.
	DefaultProxyPorts = 8
	DefaultTable      = "airlock"
	DefaultNetNSDir   = "/run/netns"
)

// DefaultSubnet is the sandbox subnet used when Config.Subnet is zero.
var DefaultSubnet = netip.MustParsePrefix("10.89.0.0/24")

// DefaultCNIBinDirs are searched for the bridge and host-local plugins.
var DefaultCNIBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// Config describes the sandbox network of one airlock installation.
type Config struct {
	// Bridge is the Linux bridge the sandboxes' veths are attached to.
	Bridge string
	// Subnet is the IPv4 sandbox subnet; its first host address is the
	// gateway, assigned to the bridge, where the egress proxy listens.
	Subnet netip.Prefix
	// ProxyPort is the first of ProxyPorts TCP ports on the gateway a
	// sandbox may reach: one per airlock instance sharing the bridge, each
	// proxy serving only the sandboxes it registered.
	ProxyPort int
	// ProxyPorts is how many consecutive ports from ProxyPort are open to
	// sandboxes. Default 8.
	ProxyPorts int
	// CNIBinDirs are the directories holding CNI plugin binaries.
	CNIBinDirs []string
	// StateDir holds host-local IPAM allocations (StateDir/ipam) and one
	// record per attachment (StateDir/netns), so both are inspectable and
	// garbage-collectable. Required.
	StateDir string
	// InstanceID is the airlock process owning the attachments (see
	// backend/local/instance); it is part of every netns name. Required by Attach.
	InstanceID string
	// Table names airlock's nftables tables ("inet <Table>" and
	// "bridge <Table>"). Default "airlock"; tests use their own.
	Table string
	// NetNSDir is where named network namespaces are bind-mounted. Default
	// /run/netns, so `ip netns` sees them.
	NetNSDir string
}

var (
	bridgeNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	tableNameRE  = regexp.MustCompile(`^[A-Za-z0-9_]{1,32}$`)
	instanceRE   = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
	runIDRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
)

// WithDefaults returns c with every zero field set to its default and checks
// the result.
func (c Config) WithDefaults() (Config, error) {
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultSubnet
	}
	if c.ProxyPorts == 0 {
		c.ProxyPorts = DefaultProxyPorts
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = DefaultProxyPort
	}
	if len(c.CNIBinDirs) == 0 {
		c.CNIBinDirs = append([]string(nil), DefaultCNIBinDirs...)
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.NetNSDir == "" {
		c.NetNSDir = DefaultNetNSDir
	}
	return c, c.validate()
}

func (c Config) validate() error {
	var errs []error
	if !bridgeNameRE.MatchString(c.Bridge) {
		errs = append(errs, fmt.Errorf("bridge name %q: want 1-15 of [A-Za-z0-9_.-]", c.Bridge))
	}
	if !c.Subnet.Addr().Is4() {
		errs = append(errs, fmt.Errorf("subnet %s: must be IPv4", c.Subnet))
	} else if c.Subnet.Bits() < 8 || c.Subnet.Bits() > 29 {
		errs = append(errs, fmt.Errorf("subnet %s: prefix length must be between 8 and 29", c.Subnet))
	} else if c.Subnet.Masked() != c.Subnet {
		errs = append(errs, fmt.Errorf("subnet %s: host bits set (did you mean %s?)", c.Subnet, c.Subnet.Masked()))
	}
	if c.ProxyPorts < 1 || c.ProxyPort+c.ProxyPorts-1 > 65535 {
		errs = append(errs, fmt.Errorf("proxy ports %d+%d: out of range", c.ProxyPort, c.ProxyPorts))
	}
	if c.ProxyPort < 1 || c.ProxyPort > 65535 {
		errs = append(errs, fmt.Errorf("proxy port %d: out of range", c.ProxyPort))
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state dir %q: must be an absolute path", c.StateDir))
	}
	if !filepath.IsAbs(c.NetNSDir) {
		errs = append(errs, fmt.Errorf("netns dir %q: must be an absolute path", c.NetNSDir))
	}
	if c.InstanceID != "" && !instanceRE.MatchString(c.InstanceID) {
		errs = append(errs, fmt.Errorf("instance id %q: want 1-32 of [a-z0-9]", c.InstanceID))
	}
	if !tableNameRE.MatchString(c.Table) {
		errs = append(errs, fmt.Errorf("nftables table %q: want 1-32 of [A-Za-z0-9_]", c.Table))
	}
	return errors.Join(errs...)
}

// Gateway is the first host address of the subnet: the bridge's address and
// the egress proxy's listen address.
func (c Config) Gateway() netip.Addr {
	return c.Subnet.Masked().Addr().Next()
}

// ProxyAddr is where the egress proxy must listen.
func (c Config) ProxyAddr() netip.AddrPort {
	return netip.AddrPortFrom(c.Gateway(), uint16(c.ProxyPort))
}

// networkName is the CNI network name, also host-local's directory under
// StateDir/ipam.
func (c Config) networkName() string { return "airlock-" + c.Bridge }

func (c Config) ipamDir() string   { return filepath.Join(c.StateDir, "ipam") }
func (c Config) recordDir() string { return filepath.Join(c.StateDir, "netns") }
func (c Config) allocDir() string  { return filepath.Join(c.ipamDir(), c.networkName()) }

// netnsName is the name of the netns (and the CNI container ID) of runID.
func netnsName(instanceID, runID string) string {
	return "airlock-" + instanceID + "-" + runID
}

// parseNetnsName splits a name made by netnsName. Instance IDs hold no '-',
// so the first '-' after the prefix ends the instance ID.
func parseNetnsName(name string) (instanceID, runID string, ok bool) {
	rest, ok := strings.CutPrefix(name, "airlock-")
	if !ok {
		return "", "", false
	}
	inst, run, ok := strings.Cut(rest, "-")
	if !ok || !instanceRE.MatchString(inst) || !runIDRE.MatchString(run) {
		return "", "", false
	}
	return inst, run, true
}

// confList is the CNI configuration: a bridge the plugin attaches a veth
// to, host-local IPAM with its data under StateDir, no NAT, no routes (the
// gateway is on-link, and no default route means traffic to anything but the
// subnet fails in the sandbox before the firewall even sees it), and
// isGateway false: airlock assigns the gateway address itself, so the plugin
// never turns on net.ipv4.ip_forward.
func (c Config) confList() ([]byte, error) {
	type rng struct {
		Subnet  string `json:"subnet"`
		Gateway string `json:"gateway"`
	}
	type ipam struct {
		Type    string  `json:"type"`
		Ranges  [][]rng `json:"ranges"`
		Routes  []any   `json:"routes"`
		DataDir string  `json:"dataDir"`
	}
	type plugin struct {
		Type             string `json:"type"`
		Bridge           string `json:"bridge"`
		IsGateway        bool   `json:"isGateway"`
		IsDefaultGateway bool   `json:"isDefaultGateway"`
		IPMasq           bool   `json:"ipMasq"`
		HairpinMode      bool   `json:"hairpinMode"`
		PromiscMode      bool   `json:"promiscMode"`
		IPAM             ipam   `json:"ipam"`
	}
	return json.Marshal(struct {
		CNIVersion string   `json:"cniVersion"`
		Name       string   `json:"name"`
		Plugins    []plugin `json:"plugins"`
	}{
		CNIVersion: "1.0.0",
		Name:       c.networkName(),
		Plugins: []plugin{{
			Type:   "bridge",
			Bridge: c.Bridge,
			IPAM: ipam{
				Type:    "host-local",
				Ranges:  [][]rng{{{Subnet: c.Subnet.String(), Gateway: c.Gateway().String()}}},
				Routes:  []any{},
				DataDir: c.ipamDir(),
			},
		}},
	})
}
