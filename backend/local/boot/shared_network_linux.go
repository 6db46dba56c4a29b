package boot

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/airlock-mcp/airlock/runtime/network"
)

// sharedNetwork is a bridge and firewall table that instances of one
// deployment share. Each instance that may set them up records them in
// the state dir, so that the last instance out removes them whatever its
// own config offers: an instance with no network (its config lists no
// domains) can be the last of a deployment whose others had one.
type sharedNetwork struct {
	Bridge string `json:"bridge"`
	Subnet string `json:"subnet"`
	Table  string `json:"table"`
}

// sharedNetworkDir holds one record per bridge and table.
func sharedNetworkDir(stateDir string) string { return filepath.Join(stateDir, "networks") }

// recordSharedNetwork records n before anything of it is made; a record
// is written whole (renamed into place) or not at all.
func recordSharedNetwork(stateDir string, n sharedNetwork) error {
	dir := sharedNetworkDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("record sandbox network: %w", err)
	}
	b, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("record sandbox network: %w", err)
	}
	p := filepath.Join(dir, n.Bridge+"."+n.Table+".json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("record sandbox network: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("record sandbox network: %w", err)
	}
	return nil
}

// removeSharedNetworks removes every recorded bridge and firewall table,
// and each record once what it names is gone (a failure keeps it for the
// next last instance out). Only the deployment's last instance out calls
// it, with the instance lock held.
func removeSharedNetworks(stateDir string, log *slog.Logger) {
	files, _ := filepath.Glob(filepath.Join(sharedNetworkDir(stateDir), "*.json"))
	for _, f := range files {
		if err := removeSharedNetwork(stateDir, f); err != nil {
			log.Warn("remove sandbox network", "record", f, "err", err)
			continue
		}
		_ = os.Remove(f)
	}
}

func removeSharedNetwork(stateDir, record string) error {
	b, err := os.ReadFile(record)
	if err != nil {
		return err
	}
	var n sharedNetwork
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("read %s: %w", record, err)
	}
	subnet, err := netip.ParsePrefix(n.Subnet)
	if err != nil {
		return fmt.Errorf("read %s: %w", record, err)
	}
	nm, err := network.New(network.Config{Bridge: n.Bridge, Subnet: subnet, Table: n.Table, StateDir: stateDir})
	if err != nil {
		return err
	}
	return errors.Join(nm.RemoveFirewall(), nm.RemoveBridge())
}
