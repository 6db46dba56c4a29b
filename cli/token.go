package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/server"
)

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage the bearer tokens of the HTTP transports"}
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Make a token for client NAME: store its hash in auth.token_file and print the secret once",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			secret, line, err := server.NewSecret(args[0])
			if err != nil {
				return err
			}
			file := a.cfg.ClientTokenFile()
			f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return fmt.Errorf("auth.token_file: %w", err)
			}
			if _, err := fmt.Fprintln(f, line); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "added token %q to %s; a running airlock picks it up within a second. The secret (shown once):\n", args[0], file)
			fmt.Println(secret)
			return nil
		},
	}
	cmd.AddCommand(add)
	return cmd
}
