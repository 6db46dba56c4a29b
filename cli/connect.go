package cli

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/server"
)

func (a *app) connectCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "connect",
		Short: "Relay this process's stdio MCP session to a running airlock daemon (run it unprivileged, from Claude Desktop or an IDE)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" {
				socket = a.cfg.Server.Socket
			}
			return a.relay(cmd.Context(), socket)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the daemon's socket (server.socket, default /run/airlock/airlock.sock); unix:// prefix optional")
	return cmd
}

func (a *app) relay(ctx context.Context, target string) error {
	path := target
	if strings.Contains(target, "://") {
		u, err := url.Parse(target)
		if err != nil || u.Scheme != "unix" {
			return fmt.Errorf("--connect %q: want unix:///path/to/airlock.sock", target)
		}
		path = u.Path
	}
	return server.Relay(ctx, os.Stdin, os.Stdout, server.RelayOptions{Socket: path, Log: a.log})
}
