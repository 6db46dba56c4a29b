package local

import (
	"context"
	"time"
)

// RunscProcs lists the runsc processes on this host (pid and arguments),
// for the external tests.
func RunscProcs() (pids []int, args [][]string) {
	for _, p := range runscProcesses() {
		pids, args = append(pids, p.pid), append(args, p.args)
	}
	return pids, args
}

// SetCheckpointBytes sets the paused sessions' disk budget, for a test;
// it returns the old one.
func SetCheckpointBytes(m *ContainerdManager, n int64) int64 {
	old := m.o.CheckpointBytes
	m.o.CheckpointBytes = n
	return old
}

// WaitTemplate waits until m has a sandbox template to restore from, and
// reports whether it has one.
func WaitTemplate(m *ContainerdManager, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return m.WaitTemplate(ctx) == nil && m.templateFor(false, m.o.PoolLimits) != nil
}

// Restored is how many sandboxes m restored from its templates.
func Restored(m *ContainerdManager) int64 { return m.tmpl.restored.Load() }

// TemplateImage is the image directory of m's current template, or "".
func TemplateImage(m *ContainerdManager) string {
	m.tmpl.mu.Lock()
	defer m.tmpl.mu.Unlock()
	if m.tmpl.t == nil {
		return ""
	}
	return m.tmpl.t.dir + "/" + imageDirName
}
