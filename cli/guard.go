package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/backend/local/guardian"
	"github.com/airlock-mcp/airlock/backend/local/instance"
)

// guardTimeout bounds a guardian's cleanup, waiting included.
const guardTimeout = 2 * time.Minute

// guardCmd is the hidden command a serving airlock runs as its guardian
// (see backend/local/guardian): it waits for the server to exit and, unless the
// server said it left nothing behind, removes what its instance made.
func (a *app) guardCmd() *cobra.Command {
	var inst string
	cmd := &cobra.Command{
		Use:    "guard",
		Short:  "Clean up after a serving airlock once it exits (started by `airlock serve`)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			// The server's signals are not the guardian's: a client that
			// signals the server's group, or a terminal closing, must not
			// stop the cleanup.
			signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
			log := a.log.With("guardian_of", inst, "guardian_pid", os.Getpid())
			clean, err := guardian.Wait(os.Stdin)
			if err != nil {
				log.Warn("lost the server's pipe; cleaning up", "err", err)
			}
			if clean {
				return nil
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), guardTimeout)
			defer cancel()
			// The pipe closes as the server exits; its instance lock is
			// released in the same exit, at most a moment later.
			for instance.Alive(a.cfg.StateDir, inst) {
				select {
				case <-ctx.Done():
					return fmt.Errorf("instance %s still alive after its pipe closed", inst)
				case <-time.After(10 * time.Millisecond):
				}
			}
			// Bringing a stack up sweeps every dead instance of the
			// deployment; leaving as the last one stops what they shared.
			stack, err := boot.Up(ctx, a.cfg, boot.NeedClient, log)
			if err != nil {
				return fmt.Errorf("clean up after instance %s: %w", inst, err)
			}
			// A sandbox the server was creating as it died may reach
			// containerd after the first sweep listed its containers.
			for range 3 {
				if stack.Sweep(ctx) == 0 {
					break
				}
			}
			instance.ForgetDead(instance.DefaultRegistry, stack.Deployment, inst)
			stack.Close(ctx)
			log.Info("cleaned up after the server", "took", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&inst, "instance", "", "the instance id of the server to clean up after")
	_ = cmd.MarkFlagRequired("instance")
	return cmd
}

// startGuardian runs this server's guardian. Without one the server still
// serves, and tears down by itself on every exit but SIGKILL.
func (a *app) startGuardian(cmd *cobra.Command, stack *boot.Stack) *guardian.Guardian {
	exe, err := os.Executable()
	if err == nil {
		args := []string{"guard", "--instance", stack.Instance.ID}
		// The guardian reads the same configuration: the file this process
		// read and its global flags (the environment it inherits), with
		// state_dir as this process resolved it.
		if used := a.v.ConfigFileUsed(); used != "" {
			p, _ := filepath.Abs(used)
			args = append(args, "--config="+p)
		}
		cmd.Root().PersistentFlags().Visit(func(f *pflag.Flag) {
			if f.Name != "state-dir" && f.Name != "config" {
				args = append(args, "--"+f.Name+"="+f.Value.String())
			}
		})
		dir, _ := filepath.Abs(a.cfg.StateDir)
		args = append(args, "--state-dir="+dir)
		var g *guardian.Guardian
		if g, err = guardian.Start(exe, args, guardian.LogPath(a.cfg.StateDir)); err == nil {
			return g
		}
	}
	a.log.Warn("no guardian: if this process is killed, its sandboxes stay until the next airlock starts or `airlock gc` runs", "err", err)
	return nil
}
