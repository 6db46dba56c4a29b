package cli

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/bench"
)

func (a *app) benchCmd() *cobra.Command {
	var modes, programs, conc, out, name, kubeconfig string
	var iterations, idle int
	var smoke bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure airlock against native Python and runc, cold and warm, direct and through MCP; write Markdown, JSON and a PNG chart",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if smoke {
				programs, conc, iterations, idle = "print,echo", "1", 2, 2
			}
			o := bench.Options{Programs: programs, Iterations: iterations, IdleSandboxes: idle, Log: a.log}
			o.Kubeconfig = kubeconfig
			if modes == "" || modes == "all" {
				o.Modes = bench.AllModes
				if kubeconfig != "" {
					o.Modes = append(o.Modes, bench.KubeModes...)
				}
			} else {
				o.Modes = strings.Split(modes, ",")
			}
			for _, c := range strings.Split(conc, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(c))
				if err != nil || n < 1 {
					return fmt.Errorf("--concurrency %q: want numbers like 1,4,16", conc)
				}
				o.Concurrency = append(o.Concurrency, n)
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Binary = exe
			if name == "" {
				name = time.Now().UTC().Format("2006-01-02T150405Z")
			}
			// The benchmark makes its own pools; the stack's would compete.
			a.cfg.Pool.Size = 0
			return a.withStack(cmd, boot.NeedManager, func(ctx context.Context, stack *boot.Stack) error {
				rep, err := bench.Run(ctx, stack, o)
				if err != nil {
					return err
				}
				fmt.Print(rep.Markdown())
				files, err := rep.Write(out, name)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "wrote %s (took %s)\n", strings.Join(files, ", "), rep.Took)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&modes, "modes", "all", "modes to run: "+strings.Join(append(bench.AllModes, bench.KubeModes...), ","))
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "a cluster for the Kubernetes modes ("+strings.Join(bench.KubeModes, ",")+"; with --modes all, they run when this is set)")
	cmd.Flags().StringVar(&programs, "programs", "all", "programs to run: print,numpy,pandas,compute,echo")
	cmd.Flags().StringVar(&conc, "concurrency", "1,4,16", "concurrency levels")
	cmd.Flags().IntVar(&iterations, "iterations", 20, "timed runs per row (and again for throughput)")
	cmd.Flags().IntVar(&idle, "idle", 8, "idle pooled sandboxes to measure the memory of (0: skip)")
	cmd.Flags().StringVar(&out, "out", "bench-results", "directory for the .md, .json and .png")
	cmd.Flags().StringVar(&name, "name", "", "file name of the results (default: the UTC time)")
	cmd.Flags().BoolVar(&smoke, "smoke", false, "a quick run that only checks every mode works (2 runs of print and echo, concurrency 1)")
	return cmd
}
