package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime/monitor"
	"github.com/airlock-mcp/airlock/runtime/monitor/agent"
)

// monitorAgentCmd runs the node side of runtime monitoring on a Kubernetes
// node (deploy/kubernetes/monitor-agent.yaml runs it as a DaemonSet): the
// monitoring socket the node's runsc reports to, and the API replicas ask.
func (a *app) monitorAgentCmd() *cobra.Command {
	var socket, listen, tokenFile, initConfig string
	var printConfig bool
	cmd := &cobra.Command{
		Use:   "monitor-agent",
		Short: "Serve a node's gVisor runtime monitoring to airlock replicas (Kubernetes; see the README)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !filepath.IsAbs(socket) {
				return fmt.Errorf("--socket %q must be an absolute path", socket)
			}
			if printConfig {
				// The pod-init-config for the node's runsc.toml.
				b, err := monitor.Config(socket)
				if err != nil {
					return err
				}
				fmt.Println(string(b))
				return nil
			}
			tb, err := os.ReadFile(tokenFile)
			if err != nil {
				return fmt.Errorf("--token-file: %w", err)
			}
			token := strings.TrimSpace(string(tb))
			if err := agent.TokenOK(token); err != nil {
				return fmt.Errorf("--token-file %s: %w", tokenFile, err)
			}
			if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
				return fmt.Errorf("socket dir: %w", err)
			}
			for _, k := range monitor.Kinds() {
				metrics.Escapes.Declare(string(k))
			}
			ag, err := agent.New(socket, agent.Options{
				Token: token,
				OnEvent: func(e monitor.Event) {
					metrics.Escapes.Inc(string(e.Kind))
					a.log.Warn("sandbox attempt", "container", e.ContainerID, "kind", e.Kind, "syscall", e.Syscall, "detail", e.Detail)
				},
				OnDropped: func(id string, n uint64) {
					metrics.MonitorDropped.Add(float64(n))
					a.log.Warn("runtime monitoring events dropped", "container", id, "dropped", n)
				},
				Log: a.log.With("component", "monitor-agent"),
			})
			if err != nil {
				return err
			}
			defer ag.Close()
			if initConfig != "" {
				if err := agent.WritePodInitConfig(initConfig, socket); err != nil {
					return err
				}
			}
			mux := http.NewServeMux()
			mux.Handle("/v1/", ag.Handler())
			mux.Handle("GET /metrics", metrics.Handler())
			mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			a.log.Info("monitor agent serving", "socket", socket, "listen", ln.Addr().String())
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case <-cmd.Context().Done():
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				// Streams stay open for a run; Close ends them.
				_ = srv.Shutdown(ctx)
				_ = srv.Close()
				return nil
			case err := <-errc:
				if errors.Is(err, http.ErrServerClosed) {
					return nil
				}
				return err
			}
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "/run/airlock/monitor/monitor.sock", "the monitoring socket the node's runsc reports to (the endpoint in its pod-init-config)")
	cmd.Flags().StringVar(&listen, "listen", ":9477", "address of the API replicas ask (and /metrics, /healthz)")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file holding the bearer token replicas send (at least 16 characters)")
	cmd.Flags().StringVar(&initConfig, "pod-init-config", "", "write the trace session config (the file runsc.toml's pod-init-config names) here once listening")
	cmd.Flags().BoolVar(&printConfig, "print-config", false, "print the pod-init-config JSON for runsc.toml and exit")
	return cmd
}
