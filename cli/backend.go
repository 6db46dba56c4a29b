package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/backend/kube"
	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// backend is what serving and `airlock run` need of the running backend,
// whichever runtime.backend chose.
type backend struct {
	Manager runtime.Manager
	// Egress is the operator's policy when networked runs are offered.
	Egress *egress.Policy
	// Secrets and Tripwires: what calls may be given beside a network.
	Secrets   *egress.Secrets
	Tripwires bool
	Ready     func(context.Context) error
	// Instance names this process in logs and on its sandboxes.
	Instance string
	// Attrs describe the backend in the "serving" log line.
	Attrs []any
	// Board shares console approvals between replicas; nil when this
	// process is alone (the local backend).
	Board approval.Board
	// Peers lists the other replicas' MCP addresses; nil when this process
	// is alone (the local backend).
	Peers func(context.Context) ([]string, error)
	// local is the containerd stack (guardian, hand-off); nil on Kubernetes.
	local *boot.Stack
	close func(context.Context)
}

// withBackend brings up the configured backend, runs fn, and tears it down.
func (a *app) withBackend(cmd *cobra.Command, fn func(context.Context, *backend) error) error {
	if a.cfg.Runtime.Backend != config.BackendKubernetes {
		return a.withStack(cmd, boot.NeedManager, func(ctx context.Context, s *boot.Stack) error {
			return fn(ctx, &backend{
				Manager: s.Manager, Egress: s.Egress, Secrets: s.Secrets, Tripwires: s.Tripwires, Ready: s.Ready, Instance: s.Instance.ID,
				Attrs: []any{"backend", config.BackendContainerd, "shim", s.Shim, "image", a.cfg.Image},
				local: s,
			})
		})
	}
	ctx := cmd.Context()
	m, err := kube.Up(ctx, a.cfg, a.log)
	if err != nil {
		return err
	}
	metrics.SetCircuitOpen(m.Breaker().Open)
	secrets, trips := m.EgressCredentials()
	b := &backend{
		Secrets: secrets, Tripwires: trips,
		Manager: m, Egress: m.EgressPolicy(), Ready: m.Ready, Instance: m.InstanceID(), Board: m.Board(), Peers: m.Peers,
		Attrs: []any{"backend", config.BackendKubernetes, "namespace", a.cfg.Kubernetes.Namespace,
			"runtime_class", a.cfg.Kubernetes.RuntimeClass, "image", a.cfg.Kubernetes.SandboxImage(a.cfg.Image)},
		close: func(ctx context.Context) {
			// This instance's pods, then its Lease.
			if err := m.Close(ctx); err != nil {
				a.log.Warn("remove sandbox pods", "err", err)
			}
		},
	}
	defer b.close(context.WithoutCancel(ctx))
	return fn(ctx, b)
}

// handOff leaves the local stack's teardown to its guardian (stdio exit).
// On Kubernetes there is no guardian: the pods go with this instance's
// Lease at close, or when another instance finds the Lease expired.
func (b *backend) handOff() {
	if b.local != nil {
		b.local.HandOff()
	}
}
