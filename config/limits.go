package config

import (
	"time"

	"github.com/airlock-mcp/airlock/runtime"
)

// RunLimits turns configured limits (and a call's timeout, 0 for the
// default) into the runtime's, for either backend. Pooled sandboxes are
// made with RunLimits(0): every call gets the same limits but for its
// timeout.
func (l Limits) RunLimits(timeoutS int) runtime.Limits {
	t := l.Timeout()
	if timeoutS > 0 {
		t = time.Duration(timeoutS) * time.Second
	}
	return runtime.Limits{
		Timeout:        t,
		MemoryBytes:    int64(l.MemoryMB) << 20,
		CPUs:           l.CPUs,
		Pids:           int64(l.Pids),
		StdoutBytes:    l.StdoutBytes,
		StderrBytes:    l.StderrBytes,
		WorkspaceBytes: int64(l.WorkspaceMB) << 20,
		TmpBytes:       int64(l.TmpMB) << 20,
	}
}
