package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/approval"
)

func (a *app) auditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read the audit log"}
	var follow bool
	var n int
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print the last audit records readably; -f to follow new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return approval.Tail(cmd.Context(), a.cfg.AuditPath(), n, follow, os.Stdout)
		},
	}
	tail.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing records as they are written")
	tail.Flags().IntVarP(&n, "lines", "n", 20, "how many of the last records to print (-1 for all)")
	cmd.AddCommand(tail)
	return cmd
}
