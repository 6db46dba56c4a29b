// Package local is airlock's local backend: it implements runtime.Manager
// and runtime.SessionManager with single-use gVisor (runsc) sandboxes on
// this host, created through containerd, with a warm pool, per-run network
// namespaces, cgroup limits, and the sweeps that remove what a crashed
// airlock left behind. backend/local/boot brings it up from config.
package local
