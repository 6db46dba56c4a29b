package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/approval"
)

func (a *app) approvalsCmd() *cobra.Command {
	var consoleURL, tokenFile string
	client := func() (*approval.ConsoleClient, error) {
		if tokenFile == "" {
			tokenFile = a.cfg.ConsoleTokenFile()
		}
		tokens, err := approval.LoadTokens(tokenFile, false)
		if err != nil {
			return nil, err
		}
		if consoleURL == "" {
			if a.cfg.Approval.Console.Listen == "" {
				return nil, fmt.Errorf("approval.console.listen is empty: no console to talk to (or pass --console URL)")
			}
			consoleURL = "http://" + a.cfg.Approval.Console.Listen
		}
		return &approval.ConsoleClient{URL: consoleURL, Token: tokens[0].Secret}, nil
	}
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List, approve and deny runs waiting on the approval console",
	}
	cmd.PersistentFlags().StringVar(&consoleURL, "console", "", "console URL (default http://<approval.console.listen>)")
	cmd.PersistentFlags().StringVar(&tokenFile, "token-file", "", "approver token file (default approval.console.token_file)")
	list := &cobra.Command{
		Use:   "list",
		Short: "Show the requests waiting for a decision, with their full code",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			r, err := c.List(cmd.Context())
			if err != nil {
				return err
			}
			if r.Partial != "" {
				fmt.Fprintf(os.Stderr, "airlock: the other replicas' requests may be missing from this list: %s\n", r.Partial)
			}
			if len(r.Pending) == 0 {
				fmt.Println("Nothing is waiting for a decision.")
			}
			for _, p := range r.Pending {
				fmt.Printf("=== %s\n%s\n\n", p.ID, p.Description)
			}
			return nil
		},
	}
	decide := func(approve bool) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			if err := c.Decide(cmd.Context(), args[0], approve); err != nil {
				return err
			}
			verb := "denied"
			if approve {
				verb = "approved"
			}
			fmt.Fprintf(os.Stdout, "%s %s\n", verb, args[0])
			return nil
		}
	}
	approve := &cobra.Command{Use: "approve ID", Short: "Approve one waiting request: it runs once", Args: cobra.ExactArgs(1), RunE: decide(true)}
	deny := &cobra.Command{Use: "deny ID", Short: "Deny one waiting request", Args: cobra.ExactArgs(1), RunE: decide(false)}
	cmd.AddCommand(list, approve, deny)
	return cmd
}
