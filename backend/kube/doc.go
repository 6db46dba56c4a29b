// Package kube is airlock's Kubernetes backend: each sandbox is a pod under
// a gVisor RuntimeClass, built from the same policy as the local backend's
// OCI spec. This is its first piece, the pure pod-spec builder; the
// manager (warm pods, streaming to the driver, sessions by label, cluster
// doctor checks) is still to come.
package kube
