package runtime

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlock-mcp/airlock/runtime/driver"
)

// The sandbox policy both backends build their specs from (an OCI spec
// locally, a pod spec on Kubernetes).

// CodeDirBytes caps the tmpfs the driver writes the code to.
const CodeDirBytes = 64 << 20

// DriverCapabilities are the capabilities of the sandbox's init, the
// driver, and of nothing else: it changes to the code's user (SETUID,
// SETGID) after emptying the bounding set (SETPCAP), so the code holds
// none in any set, and it kills the code's processes when the run ends
// (KILL: they belong to another user).
var DriverCapabilities = []string{"CAP_KILL", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"}

// DriverArgs is the command line of the sandbox's init.
func DriverArgs(uid, gid uint32, preload bool, modules []string) []string {
	args := []string{driver.Path, "--uid", strconv.FormatUint(uint64(uid), 10), "--gid", strconv.FormatUint(uint64(gid), 10)}
	if preload {
		args = append(args, "--preload", "--preload-modules="+strings.Join(modules, ","))
	}
	return args
}

// CheckSandbox refuses what no sandbox of either backend may be: code run
// as root, or a limit left unset.
func CheckSandbox(uid, gid uint32, l Limits) error {
	if uid == 0 || gid == 0 {
		return fmt.Errorf("refusing to run code as root (uid %d, gid %d)", uid, gid)
	}
	if l.MemoryBytes <= 0 || l.CPUs <= 0 || l.Pids <= 0 || l.WorkspaceBytes <= 0 || l.TmpBytes <= 0 {
		return fmt.Errorf("every limit must be positive: %+v", l)
	}
	return nil
}
