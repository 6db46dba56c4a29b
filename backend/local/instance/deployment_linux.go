package instance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-mcp/airlock/runtime/flock"
)

// A deployment is every airlock instance that shares one state_dir: they
// share its daemon (or namespace), bridge, firewall tables and records, and
// the last one out removes them. Two deployments on one host must share
// none of those, and neither may sweep what the other made.

// deploymentFile holds the deployment's id in its state_dir.
const deploymentFile = "deployment-id"

// idRE is the shape of deployment and instance ids.
var idRE = regexp.MustCompile(`^[0-9a-f]{12}$`)

// DeploymentID returns the id of the deployment whose state is stateDir,
// creating it on first use. It labels everything the deployment makes.
func DeploymentID(stateDir string) (string, error) {
	p := filepath.Join(stateDir, deploymentFile)
	for range 2 {
		if b, err := os.ReadFile(p); err == nil {
			id := strings.TrimSpace(string(b))
			if !idRE.MatchString(id) {
				return "", fmt.Errorf("%s holds %q, not a deployment id: remove the file to make a new one", p, id)
			}
			return id, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("read deployment id: %w", err)
		}
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("deployment id: %w", err)
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue // another instance made it first: read theirs
		}
		if err != nil {
			return "", fmt.Errorf("create deployment id: %w", err)
		}
		_, werr := f.WriteString(hex.EncodeToString(b[:]) + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			_ = os.Remove(p)
			return "", fmt.Errorf("write deployment id: %w", werr)
		}
	}
	return "", fmt.Errorf("deployment id %s: created and removed under us twice", p)
}

// Resources are what a deployment holds on the host that another
// deployment must not share. Empty network fields: no sandbox network.
type Resources struct {
	StateDir   string `json:"state_dir"`
	Containerd string `json:"containerd"` // the daemon's address
	Namespace  string `json:"namespace"`
	Bridge     string `json:"bridge,omitempty"`
	Subnet     string `json:"subnet,omitempty"`
	Table      string `json:"table,omitempty"`
	PID        int    `json:"pid"`
}

// DefaultRegistry is where live instances register their deployment's
// resources, host-wide.
const DefaultRegistry = "/run/airlock/deployments"

// Hold is an instance's registration. Close releases it.
type Hold struct {
	f         *os.File
	path, rec string
}

// Close releases the registration and removes its files.
func (h *Hold) Close() error {
	if h == nil || h.f == nil {
		return nil
	}
	_ = os.Remove(h.rec)
	_ = os.Remove(h.path)
	err := h.f.Close()
	h.f = nil
	return err
}

// ClashError says which setting of this deployment another live
// deployment already uses, and what to change.
type ClashError struct {
	Keys  []string // the config keys that clash
	What  string   // the shared resource, as the user named it
	Other Resources
}

func (e *ClashError) Error() string {
	return fmt.Sprintf("%s: %s is already used by the airlock deployment with state_dir %s (pid %d): give this deployment its own %s, or stop that one",
		strings.Join(e.Keys, ", "), e.What, e.Other.StateDir, e.Other.PID, strings.Join(e.Keys, " and "))
}

// Claim registers instance inst of deployment dep with the resources it
// uses in registry, refusing with a *ClashError when a live instance of
// another deployment uses the same bridge, an overlapping subnet, the same
// firewall table, or the same containerd namespace on the same daemon.
// Instances of one deployment never clash with each other (they share
// those by design). A registration lapses when its process exits, however
// it exits: it is a lock the kernel drops.
func Claim(ctx context.Context, registry, dep, inst string, r Resources) (*Hold, error) {
	if err := os.MkdirAll(registry, 0o700); err != nil {
		return nil, fmt.Errorf("create deployment registry: %w", err)
	}
	unlock, err := flock.Lock(ctx, filepath.Join(registry, "registry.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	entries, err := os.ReadDir(registry)
	if err != nil {
		return nil, fmt.Errorf("read deployment registry: %w", err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		otherDep, _, ok := strings.Cut(name, ".")
		if !ok || otherDep == dep {
			continue
		}
		if !lockHeld(filepath.Join(registry, name+".lock"), false) {
			_ = os.Remove(filepath.Join(registry, e.Name()))
			_ = os.Remove(filepath.Join(registry, name+".lock"))
			continue
		}
		b, err := os.ReadFile(filepath.Join(registry, e.Name()))
		var o Resources
		if err == nil {
			err = json.Unmarshal(b, &o)
		}
		if err != nil {
			continue // written under the lock; unreadable means not ours to judge
		}
		if err := clash(r, o); err != nil {
			return nil, err
		}
	}
	base := filepath.Join(registry, dep+"."+inst)
	f, err := os.OpenFile(base+".lock", os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("deployment lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("deployment lock: %w", err)
	}
	b, _ := json.Marshal(r)
	tmp := base + ".tmp"
	err = os.WriteFile(tmp, b, 0o600)
	if err == nil {
		err = os.Rename(tmp, base+".json")
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(base + ".lock")
		return nil, fmt.Errorf("register deployment: %w", err)
	}
	return &Hold{f: f, path: base + ".lock", rec: base + ".json"}, nil
}

// ForgetDead removes the registration of instance inst of deployment dep
// from registry when its process is gone (its guardian calls it; Claim
// removes other deployments' dead ones on its way).
func ForgetDead(registry, dep, inst string) {
	if !idRE.MatchString(dep) || !idRE.MatchString(inst) {
		return
	}
	base := filepath.Join(registry, dep+"."+inst)
	if lockHeld(base+".lock", false) {
		return
	}
	_ = os.Remove(base + ".json")
	_ = os.Remove(base + ".lock")
}

// clash reports the first resource r shares with o.
func clash(r, o Resources) error {
	switch {
	case sameAddress(r.Containerd, o.Containerd) && r.Namespace == o.Namespace:
		return &ClashError{Keys: []string{"containerd.namespace"}, What: fmt.Sprintf("namespace %q on containerd %s", r.Namespace, r.Containerd), Other: o}
	case r.Bridge != "" && r.Bridge == o.Bridge:
		return &ClashError{Keys: []string{"network.bridge"}, What: fmt.Sprintf("bridge %q", r.Bridge), Other: o}
	case r.Table != "" && r.Table == o.Table:
		return &ClashError{Keys: []string{"network.table"}, What: fmt.Sprintf("nftables table %q", r.Table), Other: o}
	case r.Subnet != "" && o.Subnet != "" && overlap(r.Subnet, o.Subnet):
		return &ClashError{Keys: []string{"network.subnet"}, What: fmt.Sprintf("subnet %s (overlaps %s)", r.Subnet, o.Subnet), Other: o}
	}
	return nil
}

// sameAddress compares two containerd addresses as paths of one socket.
func sameAddress(a, b string) bool {
	norm := func(s string) string { return filepath.Clean(strings.TrimPrefix(s, "unix://")) }
	return norm(a) == norm(b)
}

func overlap(a, b string) bool {
	pa, err1 := netip.ParsePrefix(a)
	pb, err2 := netip.ParsePrefix(b)
	return err1 == nil && err2 == nil && pa.Overlaps(pb)
}
