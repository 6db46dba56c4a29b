// Package cli is airlock's command line: one file per command, each thin
// (parse flags, call a package, print). main.go hands over to Main.
package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/config"
)

type app struct {
	version string
	v       *viper.Viper
	cfgPath string
	cfg     config.Config
	log     *slog.Logger
}

// Main runs the airlock command line and returns its exit status.
func Main(version string) int {
	a := &app{v: viper.New(), version: version}
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

	root.AddCommand(a.serveCmd(), a.runCmd(), a.doctorCmd(), a.imageCmd(), a.gcCmd(), a.approvalsCmd(), a.auditCmd(), a.connectCmd(), a.tokenCmd(), a.benchCmd(), a.guardCmd(), a.monitorAgentCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print airlock's version",
		Run:   func(*cobra.Command, []string) { fmt.Println(a.version) },
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		var ec exitCode
		if errors.As(err, &ec) {
			return int(ec)
		}
		fmt.Fprintln(os.Stderr, "airlock:", err)
		return 1
	}
	return 0
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
