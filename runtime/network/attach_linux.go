package network

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/vishvananda/netlink"

	"github.com/airlock-mcp/airlock/runtime/netns"
)

// cleanupTimeout bounds teardown work done on a context that no longer
// depends on the caller's.
const cleanupTimeout = 30 * time.Second

// Manager owns the sandbox network of one Config.
type Manager struct {
	cfg Config
	cni gocni.CNI
}

// New checks cfg (filling defaults) and prepares the CNI configuration. It
// changes nothing on the host.
func New(cfg Config) (*Manager, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	conf, err := cfg.confList()
	if err != nil {
		return nil, err
	}
	c, err := gocni.New(
		gocni.WithMinNetworkCount(1),
		gocni.WithPluginDir(cfg.CNIBinDirs),
		gocni.WithInterfacePrefix("eth"),
		gocni.WithConfListBytes(conf),
	)
	if err != nil {
		return nil, fmt.Errorf("cni: %w", err)
	}
	return &Manager{cfg: cfg, cni: c}, nil
}

// Config returns the configuration with defaults filled in.
func (m *Manager) Config() Config { return m.cfg }

// Attachment is one sandbox's network.
type Attachment struct {
	// NetNSPath is the namespace to give the sandbox (OCI spec linux.namespaces).
	NetNSPath string
	// IP is the sandbox's address; Gateway is where the egress proxy listens.
	IP      netip.Addr
	Gateway netip.Addr

	Name       string // netns name and CNI container ID
	InstanceID string
	RunID      string
	HostVeth   string // host side of the veth pair, a port of the bridge
}

// record is an Attachment as kept in StateDir/netns/<name>.json. It is
// written before the namespace exists and removed after it is gone, so GC
// finds whatever a crash left behind.
type record struct {
	Name       string    `json:"name"`
	InstanceID string    `json:"instance_id"`
	RunID      string    `json:"run_id"`
	NetNSPath  string    `json:"netns_path"`
	IP         string    `json:"ip,omitempty"`
	HostVeth   string    `json:"host_veth,omitempty"`
	Created    time.Time `json:"created"`
}

func (m *Manager) recordPath(name string) string {
	return filepath.Join(m.cfg.recordDir(), name+".json")
}

func (m *Manager) writeRecord(r record) error {
	if err := os.MkdirAll(m.cfg.recordDir(), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := m.recordPath(r.Name) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, m.recordPath(r.Name))
}

// claimRecord creates the record of a new attachment; it fails if one exists.
func (m *Manager) claimRecord(r record) error {
	if err := os.MkdirAll(m.cfg.recordDir(), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(m.recordPath(r.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s is already attached", r.Name)
	}
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(m.recordPath(r.Name))
	}
	return err
}

func (m *Manager) removeRecord(name string) error {
	if err := os.Remove(m.recordPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// cleanupStack runs undo steps in reverse order on a context detached from
// the caller's cancellation (gVisor's cleanup.Make/Release).
type cleanupStack struct {
	steps []func(context.Context) error
}

func (s *cleanupStack) add(f func(context.Context) error) { s.steps = append(s.steps, f) }

func (s *cleanupStack) run(parent context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), cleanupTimeout)
	defer cancel()
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		errs = append(errs, s.steps[i](ctx))
	}
	s.steps = nil
	return errors.Join(errs...)
}

// Attach creates the network namespace of runID and plugs it into the
// bridge. It refuses to run unless the firewall is in place. On any failure
// everything done so far is undone, in reverse order, even if ctx is
// cancelled.
func (m *Manager) Attach(ctx context.Context, runID string) (att *Attachment, err error) {
	if m.cfg.InstanceID == "" {
		return nil, errors.New("network attach: Config.InstanceID is empty")
	}
	if !runIDRE.MatchString(runID) {
		return nil, fmt.Errorf("network attach: run id %q: want [A-Za-z0-9][A-Za-z0-9_.-]{0,63}", runID)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.checkFirewall(); err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}
	if err := m.ensureBridge(); err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}

	name := netnsName(m.cfg.InstanceID, runID)
	rec := record{
		Name: name, InstanceID: m.cfg.InstanceID, RunID: runID,
		NetNSPath: filepath.Join(m.cfg.NetNSDir, name), Created: time.Now().UTC(),
	}
	// Claiming the record (O_EXCL) is what makes runID ours: a concurrent
	// or repeated Attach of the same run fails here, before it could undo
	// anything of the first one.
	if err := m.claimRecord(rec); err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}
	var undo cleanupStack
	defer func() {
		if err != nil {
			if cerr := undo.run(ctx); cerr != nil {
				err = fmt.Errorf("%w (cleanup: %v)", err, cerr)
			}
		}
	}()

	undo.add(func(context.Context) error { return m.removeRecord(name) })

	path, err := netns.Create(m.cfg.NetNSDir, name)
	if err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}
	undo.add(func(context.Context) error { return netns.Delete(path) })

	// CNI DEL is undone even if ADD failed half-way (a plugin may have made
	// the veth or taken an address before failing).
	undo.add(func(ctx context.Context) error { return m.cni.Remove(ctx, name, path) })
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res, err := m.cni.Setup(ctx, name, path)
	if err != nil {
		return nil, fmt.Errorf("network attach: cni add: %w", err)
	}

	att = &Attachment{NetNSPath: path, Gateway: m.cfg.Gateway(), Name: name, InstanceID: m.cfg.InstanceID, RunID: runID}
	for ifName, ic := range res.Interfaces {
		if ic.Sandbox != "" {
			for _, ipc := range ic.IPConfigs {
				if a, ok := netip.AddrFromSlice(ipc.IP); ok && m.cfg.Subnet.Contains(a.Unmap()) {
					att.IP = a.Unmap()
				}
			}
		} else if ifName != m.cfg.Bridge {
			att.HostVeth = ifName
		}
	}
	if !att.IP.IsValid() || att.HostVeth == "" {
		return nil, fmt.Errorf("network attach: cni result lacks the sandbox address or host veth: %+v", res.Interfaces)
	}
	if err := m.hardenPort(att.HostVeth); err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}
	undo.add(func(context.Context) error { return m.forgetPort(att.HostVeth, att.IP) })
	if err := m.allowPort(att.HostVeth, att.IP); err != nil {
		return nil, fmt.Errorf("network attach: %w", err)
	}
	rec.IP, rec.HostVeth = att.IP.String(), att.HostVeth
	if err := m.writeRecord(rec); err != nil {
		return nil, fmt.Errorf("network attach: write record: %w", err)
	}
	return att, nil
}

// Detach undoes Attach: CNI DEL (veth and address released), then the
// namespace, then the record. It is idempotent and ignores ctx's
// cancellation.
func (m *Manager) Detach(ctx context.Context, att *Attachment) error {
	if att == nil {
		return nil
	}
	return m.detach(ctx, att.Name, att.NetNSPath, att.HostVeth, att.IP)
}

func (m *Manager) detach(ctx context.Context, name, path, veth string, ip netip.Addr) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if path == "" {
		path = filepath.Join(m.cfg.NetNSDir, name)
	}
	nsPath := path
	if _, err := os.Stat(path); err != nil {
		nsPath = "" // gone already: CNI DEL still releases the address
	}
	if veth != "" && ip.IsValid() {
		if err := m.forgetPort(veth, ip); err != nil {
			return fmt.Errorf("network detach %s: %w", name, err)
		}
	}
	if err := m.cni.Remove(ctx, name, nsPath); err != nil {
		return fmt.Errorf("network detach %s: cni del: %w", name, err)
	}
	if err := netns.Delete(path); err != nil {
		return fmt.Errorf("network detach %s: %w", name, err)
	}
	if err := m.removeRecord(name); err != nil {
		return fmt.Errorf("network detach %s: %w", name, err)
	}
	return nil
}

// ensureBridge creates the bridge if needed, turns IPv6 off on it, gives it
// the gateway address and brings it up. Airlock, not the CNI plugin, owns the
// gateway address (isGateway false), so ip_forward is never switched on.
func (m *Manager) ensureBridge() error {
	l, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = m.cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create bridge %s: %w", m.cfg.Bridge, err)
		}
		if l, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
		}
	}
	if l.Type() != "bridge" {
		return fmt.Errorf("%s exists and is a %s, not a bridge", m.cfg.Bridge, l.Type())
	}
	if err := netns.WriteSysctl("net/ipv6/conf/"+m.cfg.Bridge+"/disable_ipv6", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{
		IP:   m.cfg.Gateway().AsSlice(),
		Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32),
	}}
	if err := netlink.AddrReplace(l, gw); err != nil {
		return fmt.Errorf("bridge %s address %s: %w", m.cfg.Bridge, gw.IPNet, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bridge %s up: %w", m.cfg.Bridge, err)
	}
	return nil
}

// hardenPort puts the host veth in airlock's interface group (which the
// bridge-family rules match), sets its bridge port isolated (an isolated port
// cannot send to another isolated port; the bridge itself still gets its
// frames), a second layer under the nftables rule, and turns IPv6 off on it.
// Nothing runs in the sandbox namespace yet at this point.
func (m *Manager) hardenPort(veth string) error {
	l, err := netlink.LinkByName(veth)
	if err != nil {
		return fmt.Errorf("host veth %s: %w", veth, err)
	}
	if l.Attrs().MasterIndex == 0 {
		return fmt.Errorf("host veth %s is not on bridge %s", veth, m.cfg.Bridge)
	}
	if err := netlink.LinkSetGroup(l, int(m.ifGroup())); err != nil {
		return fmt.Errorf("set interface group of %s: %w", veth, err)
	}
	if err := netlink.LinkSetIsolated(l, true); err != nil {
		return fmt.Errorf("isolate bridge port %s: %w", veth, err)
	}
	if err := netns.WriteSysctl("net/ipv6/conf/"+veth+"/disable_ipv6", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveBridge deletes the bridge (and with it any port left). For tests and
// uninstall; sandboxes still attached lose their network.
func (m *Manager) RemoveBridge() error {
	l, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}

// GC detaches every attachment whose instance alive reports dead: those with
// a record (claimed before the namespace is made, removed after it is gone)
// and host-local allocations in StateDir held by one; then it drops
// anti-spoofing entries whose veth is gone. Attachments of live instances are
// left alone.
func (m *Manager) GC(ctx context.Context, alive func(instanceID string) bool) error {
	var errs []error
	done := map[string]bool{}
	dead := func(name string) bool {
		inst, _, ok := parseNetnsName(name)
		return ok && !alive(inst)
	}

	ents, err := os.ReadDir(m.cfg.recordDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		var r record
		b, err := os.ReadFile(filepath.Join(m.cfg.recordDir(), e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.Name != name {
			r = record{Name: name}
		}
		if r.InstanceID == "" {
			r.InstanceID, _, _ = parseNetnsName(name)
		}
		if r.InstanceID == "" || alive(r.InstanceID) {
			continue
		}
		done[name] = true
		ip, _ := netip.ParseAddr(r.IP)
		errs = append(errs, m.detach(ctx, name, r.NetNSPath, r.HostVeth, ip))
	}

	// NetNSDir itself is not scanned: other software (and tests) name
	// namespaces "airlock-..." too, and every namespace Attach makes has a
	// record from before it exists until after it is gone.

	ents, err = os.ReadDir(m.cfg.allocDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err != nil {
			continue // lock, last_reserved_ip.0
		}
		id := allocOwner(filepath.Join(m.cfg.allocDir(), e.Name()))
		if id != "" && !done[id] && dead(id) {
			done[id] = true
			errs = append(errs, m.detach(ctx, id, "", "", netip.Addr{}))
		}
	}

	// Port-set entries whose veth is gone (a detach interrupted after CNI
	// DEL, or a record lost).
	if ports, err := m.portEntries(); err == nil {
		for veth, ip := range ports {
			if _, err := netlink.LinkByName(veth); err != nil {
				var nf netlink.LinkNotFoundError
				if errors.As(err, &nf) {
					errs = append(errs, m.forgetPort(veth, ip))
				}
			}
		}
	} else if m.checkFirewall() == nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// allocOwner reads the container ID from a host-local allocation file
// ("<id>\r\n<ifname>", or just "<id>" from older plugins).
func allocOwner(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	if !s.Scan() {
		return ""
	}
	return strings.TrimSpace(s.Text())
}
