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
			} else if modes == "safety" {
				o.Modes = bench.SafetyModes
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
				return printReport(rep, rep.Took, out, name)
			})
		},
	}
	cmd.Flags().StringVar(&modes, "modes", "all", "modes to run: "+strings.Join(append(bench.AllModes, bench.KubeModes...), ",")+"; or safety: "+strings.Join(bench.SafetyModes, ","))
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "a cluster for the Kubernetes modes ("+strings.Join(bench.KubeModes, ",")+"; with --modes all, they run when this is set)")
	cmd.Flags().StringVar(&programs, "programs", "all", "programs to run: print,numpy,pandas,compute,echo")
	cmd.Flags().StringVar(&conc, "concurrency", "1,4,16", "concurrency levels")
	cmd.Flags().IntVar(&iterations, "iterations", 20, "timed runs per row (and again for throughput)")
	cmd.Flags().IntVar(&idle, "idle", 8, "idle pooled sandboxes to measure the memory of (0: skip)")
	cmd.Flags().StringVar(&out, "out", "bench-results", "directory for the .md, .json and .png")
	cmd.Flags().StringVar(&name, "name", "", "file name of the results (default: the UTC time)")
	cmd.Flags().BoolVar(&smoke, "smoke", false, "a quick run that only checks every mode works (2 runs of print and echo, concurrency 1)")
	cmd.AddCommand(a.benchClaimsCmd(), a.benchEgressCmd())
	return cmd
}

// benchEgressCmd measures the egress proxy alone: an HTTPS GET directly,
// through a blind tunnel and intercepted, on loopback in this process.
func (a *app) benchEgressCmd() *cobra.Command {
	var n int
	var out, name string
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Measure the egress proxy's HTTPS cost: direct, blind CONNECT tunnel, intercepted (in-process, loopback only; seconds)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 1 {
				return fmt.Errorf("--iterations %d: want at least 1", n)
			}
			rep, err := bench.RunEgress(cmd.Context(), n)
			if err != nil {
				return err
			}
			if name == "" {
				name = time.Now().UTC().Format("2006-01-02T150405Z") + "-egress"
			}
			return printReport(rep, rep.Took, out, name)
		},
	}
	cmd.Flags().IntVar(&n, "iterations", 500, "timed requests per row")
	cmd.Flags().StringVar(&out, "out", "bench-results", "directory for the .md and .json")
	cmd.Flags().StringVar(&name, "name", "", "file name of the results (default: the UTC time and -egress)")
	return cmd
}

// benchClaimsCmd is the warm-pod claim benchmark: fake nodes and pods
// (kwok) on a real API server, claimed by replicas at rising rates.
func (a *app) benchClaimsCmd() *cobra.Command {
	o := bench.ClaimOptions{}
	var rates, out, name string
	var smoke bool
	cmd := &cobra.Command{
		Use:   "claims",
		Short: "Measure warm-pod claims on a real API server: kwok's fake nodes, a pool of ready pods, replicas claiming at rising rates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Kube == "" {
				return fmt.Errorf("--kubeconfig is required (scripts/cluster.sh kubeconfig names the test cluster's)")
			}
			if smoke {
				o.Nodes, o.Pool, o.Claims, o.Burst, rates = 3, 40, 20, 20, "20"
			}
			o.Rates = nil
			for _, r := range strings.Split(rates, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(r))
				if err != nil || n < 1 {
					return fmt.Errorf("--rates %q: want claims a second like 25,50,100", rates)
				}
				o.Rates = append(o.Rates, n)
			}
			if o.QPS == 0 {
				o.QPS, o.QPSBurst = a.cfg.Kubernetes.QPS, a.cfg.Kubernetes.Burst
			}
			if o.QPSBurst < int(o.QPS) {
				o.QPSBurst = 2 * int(o.QPS)
			}
			o.Log = a.log
			if name == "" {
				name = time.Now().UTC().Format("2006-01-02T150405Z") + "-claims"
			}
			rep, err := bench.Claims(cmd.Context(), o)
			if err != nil {
				return err
			}
			return printReport(rep, rep.Took, out, name)
		},
	}
	cmd.Flags().StringVar(&o.Kube, "kubeconfig", "", "the cluster (its API server takes the load; its real nodes are untouched)")
	cmd.Flags().StringVar(&o.Kwok, "kwok", "", "the kwok binary (default: kwok on PATH)")
	cmd.Flags().IntVar(&o.Nodes, "nodes", 50, "fake nodes")
	cmd.Flags().IntVar(&o.Pool, "pool", 1000, "ready warm pods before each step")
	cmd.Flags().IntVar(&o.Replicas, "replicas", 2, "claimers, each with its own client and watch, as airlock replicas")
	cmd.Flags().StringVar(&rates, "rates", "25,50,100,200", "claims a second, one step each")
	cmd.Flags().IntVar(&o.Claims, "claims", 500, "claims per rate")
	cmd.Flags().IntVar(&o.Burst, "burst", 300, "claims sent at once in the last step (0: none)")
	cmd.Flags().Float64Var(&o.QPS, "qps", 0, "each replica's requests a second to the API server (default: kubernetes.qps)")
	cmd.Flags().IntVar(&o.QPSBurst, "qps-burst", 0, "each replica's burst above --qps (default: kubernetes.burst, or twice --qps)")
	cmd.Flags().StringVar(&out, "out", "bench-results", "directory for the .md and .json")
	cmd.Flags().StringVar(&name, "name", "", "file name of the results (default: the UTC time and -claims)")
	cmd.Flags().BoolVar(&smoke, "smoke", false, "a quick run that only checks it works (3 nodes, 40 pods, 20 claims at 20/s and 20 at once)")
	return cmd
}

// printReport prints a benchmark's table and saves its files.
func printReport(rep interface {
	Markdown() string
	Write(dir, name string) ([]string, error)
}, took, out, name string) error {
	fmt.Print(rep.Markdown())
	files, err := rep.Write(out, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s (took %s)\n", strings.Join(files, ", "), took)
	return nil
}
