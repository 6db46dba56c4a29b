// Command airlock is an MCP server that runs AI agents' Python and shell code
// in gVisor sandboxes through containerd.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/spf13/cobra"
	"github.com/spf13/viper"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime/boot"
	"github.com/airlock-mcp/airlock/runtime/doctor"
	"github.com/airlock-mcp/airlock/runtime/image"
	"github.com/airlock-mcp/airlock/server"
	"github.com/airlock-mcp/airlock/tools"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type app struct {
	v       *viper.Viper
	cfgPath string
	cfg     config.Config
	log     *slog.Logger
}

func main() {
	a := &app{v: viper.New()}
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Run AI agents' code in gVisor sandboxes, served over MCP",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.load()
		},
	}
	root.PersistentFlags().StringVar(&a.cfgPath, "config", "", "config file (default ./config.yaml, then /etc/airlock/config.yaml)")
	root.PersistentFlags().String("log-level", "", "log level: debug, info, warn, error (log.level)")
	root.PersistentFlags().String("state-dir", "", "directory for airlock's state and embedded containerd (state_dir)")
	_ = a.v.BindPFlag("log.level", root.PersistentFlags().Lookup("log-level"))
	_ = a.v.BindPFlag("state_dir", root.PersistentFlags().Lookup("state-dir"))

	root.AddCommand(a.serveCmd(), a.runCmd(), a.doctorCmd(), a.imageCmd(), a.gcCmd(), a.approvalsCmd(), a.auditCmd(), a.connectCmd(), a.tokenCmd(), a.benchCmd(), a.guardCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print airlock's version",
		Run:   func(*cobra.Command, []string) { fmt.Println(version) },
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}

// exitCode makes `airlock run` exit with the sandboxed program's status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func (a *app) load() error {
	// Flags left empty must not override config: viper treats a bound flag's
	// empty default as unset only if it was not changed, which is what we want.
	cfg, err := config.Load(a.v, a.cfgPath)
	if err != nil {
		return err
	}
	a.cfg = cfg
	a.log = newLogger(cfg.Log)
	slog.SetDefault(a.log)
	return nil
}

func newLogger(c config.LogConfig) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	// Always stderr: on the stdio transport stdout is the protocol stream.
	if strings.EqualFold(c.Format, "json") {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// withStack brings the runtime up to need, runs fn, and tears it down.
func (a *app) withStack(cmd *cobra.Command, need boot.Need, fn func(context.Context, *boot.Stack) error) error {
	ctx := cmd.Context()
	stack, err := boot.Up(ctx, a.cfg, need, a.log)
	if err != nil {
		return err
	}
	defer stack.Close(context.WithoutCancel(ctx))
	return fn(ctx, stack)
}

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
			err := a.withStack(cmd, boot.NeedManager, func(ctx context.Context, stack *boot.Stack) error {
				h, closeHandlers, err := a.handlers(ctx, stack)
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

func (a *app) imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build or import sandbox images"}
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the default sandbox image (Debian bookworm, python3, numpy, pandas, matplotlib); cached",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStack(cmd, boot.NeedClient, func(ctx context.Context, stack *boot.Stack) error {
				built, err := image.Build(ctx, stack.Client, a.cfg.StateDir, a.cfg.Image, image.DefaultRecipe(image.HostMirror()), a.log)
				if err != nil {
					return err
				}
				if built {
					fmt.Printf("built and imported %s\n", a.cfg.Image)
				} else {
					fmt.Printf("%s is up to date\n", a.cfg.Image)
				}
				return nil
			})
		},
	}
	var tag string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import an OCI or docker image archive",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withStack(cmd, boot.NeedClient, func(ctx context.Context, stack *boot.Stack) error {
				names, err := image.Import(ctx, stack.Client, args[0], tag)
				if err != nil {
					return err
				}
				for _, n := range names {
					fmt.Println(n)
				}
				return nil
			})
		},
	}
	imp.Flags().StringVar(&tag, "tag", "", "also tag the imported image with this reference (e.g. the `image` config value)")
	cmd.AddCommand(build, imp)
	return cmd
}

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
