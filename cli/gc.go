package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/local/boot"
)

func (a *app) gcCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove sandboxes left behind by airlock processes that are no longer running",
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Bringing the stack up removes dead instances' sandboxes on its way.
			return a.withStack(cmd, boot.NeedClient, func(context.Context, *boot.Stack) error {
				fmt.Println("ok")
				return nil
			})
		},
	}
}
