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

var deploymentIDRE = regexp.MustCompile(`^[0-9a-f]{12}$`)

// DeploymentID returns the id of the deployment whose state is stateDir,
// creating it on first use. It labels everything the deployment makes.
func DeploymentID(stateDir string) (string, error) {
	p := filepath.Join(stateDir, deploymentFile)
	for range 2 {
		if b, err := os.ReadFile(p); err == nil {
			id := strings.TrimSpace(string(b))
			if !deploymentIDRE.MatchString(id) {
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

// DefaultRegistry is where live deployments are registered, host-wide.
const DefaultRegistry = "/run/airlock/deployments"

// Hold is a deployment registered as live by this process. Close releases it.
type Hold struct{ f *os.File }

// Close releases the hold; the deployment stays registered while any
// other of its instances holds it.
func (h *Hold) Close() error {
	if h == nil || h.f == nil {
		return nil
	}
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

// Claim registers deployment id with its resources in registry, refusing
// with a *ClashError when another live deployment uses the same bridge,
// overlapping subnet, the same firewall table, or the same containerd
// namespace on the same daemon. Instances of one deployment share the
// registration; it lapses when the last of them exits, however it exits.
func Claim(ctx context.Context, registry, id string, r Resources) (*Hold, error) {
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
		other, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || other == id {
			continue
		}
		if !deploymentAlive(registry, other) {
			_ = os.Remove(filepath.Join(registry, e.Name()))
			_ = os.Remove(filepath.Join(registry, other+".lock"))
			continue
		}
		b, err := os.ReadFile(filepath.Join(registry, e.Name()))
		var o Resources
		if err == nil {
			err = json.Unmarshal(b, &o)
		}
		if err != nil {
			continue // being written by its owner, who checks against us under the lock
		}
		if err := clash(r, o); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(filepath.Join(registry, id+".lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("deployment lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("deployment lock: %w", err)
	}
	b, _ := json.Marshal(r)
	tmp := filepath.Join(registry, "."+id+".tmp")
	err = os.WriteFile(tmp, b, 0o600)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(registry, id+".json"))
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("register deployment: %w", err)
	}
	return &Hold{f: f}, nil
}

// deploymentAlive reports whether some process holds deployment id's lock.
func deploymentAlive(registry, id string) bool {
	f, err := os.OpenFile(filepath.Join(registry, id+".lock"), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	return false
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
