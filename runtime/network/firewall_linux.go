package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Counter names, as returned by DropCounters and stored as rule comments.
const (
	CounterInputIPv6    = "input_ipv6"               // IPv6 from the bridge to the host
	CounterInputHost    = "input_sandbox_to_host"    // IPv4 from the bridge to any host address but the proxy
	CounterInputSpoofed = "input_spoofed_subnet"     // subnet source address arriving on another interface
	CounterForwardFrom  = "forward_from_bridge"      // routed traffic leaving the bridge
	CounterForwardTo    = "forward_to_bridge"        // routed traffic entering the bridge
	CounterForwardSrc   = "forward_from_subnet"      // routed traffic with a subnet source
	CounterForwardDst   = "forward_to_subnet"        // routed traffic with a subnet destination
	CounterBridgeFwd    = "bridge_from_sandbox_port" // frames bridged from a sandbox to another port
	CounterBridgeToPort = "bridge_to_sandbox_port"   // frames bridged to a sandbox from another port
	CounterBridgeNonIP  = "bridge_input_non_ipv4"    // frames to the host that are neither IPv4 nor ARP
	CounterSpoofedIP    = "bridge_spoofed_ip"        // IPv4 from a sandbox port with another source address
	CounterSpoofedARP   = "bridge_spoofed_arp"       // ARP from a sandbox port claiming another address

	acceptProxy = "accept_proxy" // not a drop counter; kept out of DropCounters
)

const (
	chainInput   = "input"
	chainForward = "forward"
	// portSet holds "host veth . sandbox address" for every attachment:
	// the only source address each sandbox port may use.
	portSet = "sandbox_ports"
)

func (m *Manager) portSet() *nftables.Set {
	kt, err := nftables.ConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	if err != nil {
		panic(err) // constant arguments
	}
	return &nftables.Set{Table: m.bridgeTable(), Name: portSet, KeyType: kt, Concatenation: true}
}

func portElement(veth string, ip netip.Addr) nftables.SetElement {
	a := ip.As4()
	return nftables.SetElement{Key: append(ifname(veth), a[:]...)}
}

func (m *Manager) inetTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
}

func (m *Manager) bridgeTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyBridge}
}

// ifname is an interface name as the kernel compares it: NUL padded to
// IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func isIPv4() []expr.Any {
	return metaCmp(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})
}

// ipField matches the IPv4 source (offset 12) or destination (16) against
// prefix p.
func ipField(offset uint32, p netip.Prefix) []expr.Any {
	m := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	net := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

func counterVerdict(v expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: v}}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

type ruleSpec struct {
	name  string
	exprs []expr.Any
}

// inputRules guard the host itself. Only TCP to the gateway's proxy ports passes.
func (m *Manager) inputRules() []ruleSpec {
	br := ifname(m.cfg.Bridge)
	gw := m.cfg.Gateway().As4()
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(m.cfg.ProxyPort))
	lastPort := make([]byte, 2)
	binary.BigEndian.PutUint16(lastPort, uint16(m.cfg.ProxyPort+m.cfg.ProxyPorts-1))
	fromBridge := metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, br)
	return []ruleSpec{
		{CounterInputIPv6, cat(fromBridge,
			metaCmp(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV6}),
			counterVerdict(expr.VerdictDrop))},
		{acceptProxy, cat(fromBridge, isIPv4(),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]},
			},
			metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{unix.IPPROTO_TCP}),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: port, ToData: lastPort},
				&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
					Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW|expr.CtStateBitESTABLISHED),
					Xor:  []byte{0, 0, 0, 0}},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			},
			counterVerdict(expr.VerdictAccept))},
		{CounterInputHost, cat(fromBridge, counterVerdict(expr.VerdictDrop))},
		{CounterInputSpoofed, cat(
			metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpNeq, ifname("lo")),
			isIPv4(), ipField(12, m.cfg.Subnet),
			counterVerdict(expr.VerdictDrop))},
	}
}

// forwardRules: nothing is ever routed from or to the sandbox network.
func (m *Manager) forwardRules() []ruleSpec {
	br := ifname(m.cfg.Bridge)
	return []ruleSpec{
		{CounterForwardFrom, cat(metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, br), counterVerdict(expr.VerdictDrop))},
		{CounterForwardTo, cat(metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, br), counterVerdict(expr.VerdictDrop))},
		{CounterForwardSrc, cat(isIPv4(), ipField(12, m.cfg.Subnet), counterVerdict(expr.VerdictDrop))},
		{CounterForwardDst, cat(isIPv4(), ipField(16, m.cfg.Subnet), counterVerdict(expr.VerdictDrop))},
	}
}

// ifGroup is the interface group airlock puts its sandbox ports (host veths)
// in. The bridge-family rules match on it: matching on the bridge's name
// (meta ibrname) needs CONFIG_NFT_BRIDGE_META, which kernels such as this
// project's VMs lack, while iifgroup/oifgroup work everywhere. The group is
// derived from the table name, so a second installation (or a test) has its
// own.
func (m *Manager) ifGroup() uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte("airlock/" + m.cfg.Table))
	return h.Sum32()&0x7fffffff | 0x40000000
}

func (m *Manager) groupMatch(key expr.MetaKey) []expr.Any {
	return metaCmp(key, expr.CmpOpEq, binary.NativeEndian.AppendUint32(nil, m.ifGroup()))
}

// bridgeForwardRules act at layer 2: a frame the bridge would carry from a
// sandbox port to any other port, or to a sandbox port from any other port,
// is dropped, ARP included, so sandboxes cannot even learn each other's MAC
// addresses. Frames for the host itself take the bridge input hook instead.
func (m *Manager) bridgeForwardRules() []ruleSpec {
	return []ruleSpec{
		{CounterBridgeFwd, cat(m.groupMatch(expr.MetaKeyIIFGROUP), counterVerdict(expr.VerdictDrop))},
		{CounterBridgeToPort, cat(m.groupMatch(expr.MetaKeyOIFGROUP), counterVerdict(expr.VerdictDrop))},
	}
}

// bridgeInputRules let only IPv4 and ARP frames from a sandbox reach the
// host, and only with the sandbox's own address as source (so one sandbox
// cannot pass for another to the proxy, nor poison the host's ARP cache);
// the inet table then filters the IPv4.
func (m *Manager) bridgeInputRules() []ruleSpec {
	etherType := func(t uint16) []byte { return binary.BigEndian.AppendUint16(nil, t) }
	notOwnAddr := func(offset uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: portSet, Invert: true},
		}
	}
	return []ruleSpec{
		{CounterSpoofedIP, cat(m.groupMatch(expr.MetaKeyIIFGROUP),
			metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherType(unix.ETH_P_IP)),
			notOwnAddr(12), counterVerdict(expr.VerdictDrop))},
		{CounterSpoofedARP, cat(m.groupMatch(expr.MetaKeyIIFGROUP),
			metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpEq, etherType(unix.ETH_P_ARP)),
			notOwnAddr(14), counterVerdict(expr.VerdictDrop))},
		{CounterBridgeNonIP, cat(m.groupMatch(expr.MetaKeyIIFGROUP),
			metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpNeq, etherType(unix.ETH_P_IP)),
			metaCmp(expr.MetaKeyPROTOCOL, expr.CmpOpNeq, etherType(unix.ETH_P_ARP)),
			counterVerdict(expr.VerdictDrop))},
	}
}

type chainSpec struct {
	table *nftables.Table
	name  string
	hook  *nftables.ChainHook
	rules []ruleSpec
}

func (m *Manager) chains() []chainSpec {
	inet, bridge := m.inetTable(), m.bridgeTable()
	return []chainSpec{
		{inet, chainInput, nftables.ChainHookInput, m.inputRules()},
		{inet, chainForward, nftables.ChainHookForward, m.forwardRules()},
		{bridge, chainInput, nftables.ChainHookInput, m.bridgeInputRules()},
		{bridge, chainForward, nftables.ChainHookForward, m.bridgeForwardRules()},
	}
}

// EnsureFirewall installs (or reinstalls) airlock's tables in one atomic
// netlink transaction: there is no moment with a half-built rule set. It is
// idempotent; calling it again rebuilds the same rules, which resets the
// counters. Traffic not involving the sandbox bridge or subnet is accepted
// by these chains (policy accept) and left to the host's own firewall.
func (m *Manager) EnsureFirewall() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 1)
	seen := map[*nftables.Table]bool{}
	for _, cs := range m.chains() {
		if !seen[cs.table] {
			seen[cs.table] = true
			c.AddTable(cs.table)
			c.FlushTable(cs.table) // rules only: the port set keeps its elements
			if cs.table.Family == nftables.TableFamilyBridge {
				if err := c.AddSet(m.portSet(), nil); err != nil {
					return fmt.Errorf("nftables set %s: %w", portSet, err)
				}
			}
		}
		ch := c.AddChain(&nftables.Chain{
			Name: cs.name, Table: cs.table, Type: nftables.ChainTypeFilter,
			Hooknum: cs.hook, Priority: prio, Policy: &accept,
		})
		for _, r := range cs.rules {
			c.AddRule(&nftables.Rule{
				Table: cs.table, Chain: ch, Exprs: r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.name),
			})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install nftables tables %q: %w", m.cfg.Table, err)
	}
	return nil
}

// EnsureFirewall is Manager.EnsureFirewall for cfg.
func EnsureFirewall(cfg Config) error {
	m, err := New(cfg)
	if err != nil {
		return err
	}
	return m.EnsureFirewall()
}

// RemoveFirewall deletes airlock's tables; it is a no-op when they are
// absent. Only call it once no sandbox is attached: without the tables the
// sandboxes can reach the host.
func (m *Manager) RemoveFirewall() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	var errs []error
	for _, t := range []*nftables.Table{m.inetTable(), m.bridgeTable()} {
		ok, err := tableExists(c, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		c.DelTable(t)
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete table %s: %w", t.Name, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveFirewall is Manager.RemoveFirewall for cfg.
func RemoveFirewall(cfg Config) error {
	m, err := New(cfg)
	if err != nil {
		return err
	}
	return m.RemoveFirewall()
}

// allowPort records veth's one permitted source address.
func (m *Manager) allowPort(veth string, ip netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := c.SetAddElements(m.portSet(), []nftables.SetElement{portElement(veth, ip)}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add %s . %s to set %s: %w", veth, ip, portSet, err)
	}
	return nil
}

// forgetPort removes veth's entry; absent is fine.
func (m *Manager) forgetPort(veth string, ip netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if err := c.SetDeleteElements(m.portSet(), []nftables.SetElement{portElement(veth, ip)}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete %s . %s from set %s: %w", veth, ip, portSet, err)
	}
	return nil
}

// portEntries lists the set as host veth name -> address.
func (m *Manager) portEntries() (map[string]netip.Addr, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	els, err := c.GetSetElements(m.portSet())
	if err != nil {
		return nil, fmt.Errorf("list set %s: %w", portSet, err)
	}
	out := map[string]netip.Addr{}
	for _, e := range els {
		if len(e.Key) < unix.IFNAMSIZ+4 {
			continue
		}
		name := string(bytes.TrimRight(e.Key[:unix.IFNAMSIZ], "\x00"))
		out[name] = netip.AddrFrom4([4]byte(e.Key[unix.IFNAMSIZ : unix.IFNAMSIZ+4]))
	}
	return out, nil
}

func tableExists(c *nftables.Conn, t *nftables.Table) (bool, error) {
	ts, err := c.ListTablesOfFamily(t.Family)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, x := range ts {
		if x.Name == t.Name {
			return true, nil
		}
	}
	return false, nil
}

// installedRules returns the comment of every rule in airlock's chains with
// its counter (nil when the rule has none), per chain.
func (m *Manager) installedRules() (map[string][]*nftables.Rule, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	out := map[string][]*nftables.Rule{}
	for _, cs := range m.chains() {
		ok, err := tableExists(c, cs.table)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("nftables table %s %s is missing", familyName(cs.table.Family), cs.table.Name)
		}
		rules, err := c.GetRules(cs.table, &nftables.Chain{Name: cs.name, Table: cs.table})
		if err != nil {
			return nil, fmt.Errorf("list rules of %s %s %s: %w", familyName(cs.table.Family), cs.table.Name, cs.name, err)
		}
		out[familyName(cs.table.Family)+"/"+cs.name] = rules
	}
	return out, nil
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return fmt.Sprint(f)
}

// checkFirewall fails unless every chain holds exactly the rules
// EnsureFirewall puts there. Attach calls it first: no firewall, no network.
func (m *Manager) checkFirewall() error {
	got, err := m.installedRules()
	if err != nil {
		return fmt.Errorf("firewall not in place (run EnsureFirewall first): %w", err)
	}
	for _, cs := range m.chains() {
		rules := got[familyName(cs.table.Family)+"/"+cs.name]
		if len(rules) != len(cs.rules) {
			return fmt.Errorf("firewall not in place: chain %s %s has %d rules, want %d",
				familyName(cs.table.Family), cs.name, len(rules), len(cs.rules))
		}
		for i, r := range rules {
			name, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			if name != cs.rules[i].name {
				return fmt.Errorf("firewall not in place: chain %s %s rule %d is %q, want %q",
					familyName(cs.table.Family), cs.name, i, name, cs.rules[i].name)
			}
		}
	}
	return nil
}

// DropCounters returns the packets dropped by each drop rule since the last
// EnsureFirewall, keyed by the Counter* names.
func (m *Manager) DropCounters() (map[string]uint64, error) {
	got, err := m.installedRules()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, rules := range got {
		for _, r := range rules {
			name, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			if name == "" || name == acceptProxy {
				continue
			}
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					out[name] += ctr.Packets
				}
			}
		}
	}
	return out, nil
}

// RuleCount is the number of rules in airlock's chains.
func (m *Manager) RuleCount() (int, error) {
	got, err := m.installedRules()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, rules := range got {
		n += len(rules)
	}
	return n, nil
}
