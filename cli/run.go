package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/server"
	"github.com/airlock-mcp/airlock/tools"
)

func (a *app) runCmd() *cobra.Command {
	var timeout int
	var asJSON bool
	var netMode string
	var allowDomains []string
	cmd := &cobra.Command{
		Use:   "run python|shell [CODE|-]",
		Short: "Run code once in a sandbox, from a terminal (CODE or - for stdin)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var tool, key string
			switch args[0] {
			case "python":
				tool, key = "run_python", "code"
			case "shell":
				tool, key = "run_shell", "command"
			default:
				return fmt.Errorf("unknown language %q: use python or shell", args[0])
			}
			code := "-"
			if len(args) == 2 {
				code = args[1]
			}
			if code == "-" {
				b, err := io.ReadAll(io.LimitReader(os.Stdin, int64(a.cfg.Limits.CodeBytes)+1))
				if err != nil {
					return fmt.Errorf("read code from stdin: %w", err)
				}
				code = string(b)
			}
			raw := map[string]any{key: code}
			if timeout > 0 {
				raw["timeout_s"] = float64(timeout)
			}
			if netMode != "" {
				raw["network"] = netMode
			}
			if len(allowDomains) > 0 {
				list := make([]any, len(allowDomains))
				for i, d := range allowDomains {
					list[i] = d
				}
				raw["allow_domains"] = list
			}
			var res *mcp.CallToolResult
			err := a.withBackend(cmd, func(ctx context.Context, b *backend) error {
				h, closeHandlers, err := a.handlers(ctx, b)
				if err != nil {
					return err
				}
				defer closeHandlers()
				caller := server.StdioCaller()
				caller.ID, caller.Transport = "cli:"+strings.TrimPrefix(caller.ID, "stdio:"), "cli"
				res = h.Call(tools.WithCaller(ctx, caller), tool, raw)
				return nil
			})
			if err != nil {
				return err
			}
			out, ok := res.StructuredContent.(tools.RunOutput)
			if !ok {
				// Not run: arguments, approval, audit or infrastructure.
				for _, c := range res.Content {
					if tc, ok := c.(mcp.TextContent); ok {
						fmt.Fprintln(os.Stderr, "airlock:", tc.Text)
					}
				}
				return exitCode(2)
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			} else {
				fmt.Fprint(os.Stdout, out.Stdout)
				fmt.Fprint(os.Stderr, out.Stderr)
				if out.Reason != "" {
					fmt.Fprintf(os.Stderr, "airlock: %s\n", out.Reason)
				}
			}
			if out.ExitCode != 0 {
				return exitCode(out.ExitCode)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&timeout, "timeout", 0, "timeout in seconds (default limits.timeout_s)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON (the tool's structuredContent)")
	cmd.Flags().StringVar(&netMode, "network", "", "none or allowlist (default network.mode)")
	cmd.Flags().StringSliceVar(&allowDomains, "allow-domain", nil, "with --network allowlist: narrow the allow-list to these domains (repeatable)")
	return cmd
}
