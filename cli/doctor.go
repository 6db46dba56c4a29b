package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/local/doctor"
)

func (a *app) doctorCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for everything airlock needs, and print the fix for each problem",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ok := doctor.Run(cmd.Context(), a.cfg, os.Stdout, a.log)
			if !ok {
				return exitCode(1)
			}
			return nil
		},
	}
}
