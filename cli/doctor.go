package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/kube"
	"github.com/airlock-mcp/airlock/backend/local/doctor"
	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/checks"
)

func (a *app) doctorCmd() *cobra.Command {
	var backend string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host (or the cluster, with --backend kubernetes) for everything airlock needs, and print the fix for each problem",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if backend == "" {
				backend = a.cfg.Runtime.Backend
			}
			var ok bool
			switch backend {
			case config.BackendContainerd:
				ok = doctor.Run(cmd.Context(), a.cfg, os.Stdout, a.log)
			case config.BackendKubernetes:
				ok = checks.Print(os.Stdout, kube.Doctor(cmd.Context(), a.cfg, a.log))
			default:
				return fmt.Errorf("--backend %q: want %s or %s", backend, config.BackendContainerd, config.BackendKubernetes)
			}
			if !ok {
				return exitCode(1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&backend, "backend", "", "the backend to check: containerd or kubernetes (default runtime.backend)")
	return cmd
}
