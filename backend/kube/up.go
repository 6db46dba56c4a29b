package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/monitor/agent"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// Connect returns a client of the cluster kubernetes.kubeconfig names, or
// of the cluster airlock runs in when it names none.
func Connect(k config.KubernetesConfig) (*kubernetes.Clientset, *rest.Config, error) {
	var cfg *rest.Config
	var err error
	if k.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes backend: cluster config (kubernetes.kubeconfig): %w", err)
	}
	// Zero leaves client-go's 5 a second; a config built by hand (a
	// test's) may say nothing.
	if k.QPS > 0 {
		cfg.QPS, cfg.Burst = float32(k.QPS), max(k.Burst, 1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes backend: client: %w", err)
	}
	return cs, cfg, nil
}

// Up connects to the cluster, checks that the namespace and runtime class
// exist, removes what airlock instances that died left there (their
// expired Leases, and so their pods), and starts a Manager for this
// process.
func Up(ctx context.Context, cfg config.Config, log *slog.Logger) (*Manager, error) {
	k := cfg.Kubernetes
	cs, rc, err := Connect(k)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Get(cctx, k.Namespace, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("kubernetes backend: namespace %s (kubernetes.namespace; create it, or see `airlock doctor`): %w", k.Namespace, err)
	}
	if _, err := cs.NodeV1().RuntimeClasses().Get(cctx, k.RuntimeClass, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("kubernetes backend: runtime class %s (kubernetes.runtime_class; a RuntimeClass whose handler is runsc): %w", k.RuntimeClass, err)
	}
	if cfg.NetworkOffered() {
		if _, err := cs.NodeV1().RuntimeClasses().Get(cctx, k.NetworkRuntimeClass, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("kubernetes backend: runtime class %s (kubernetes.network_runtime_class; a RuntimeClass whose gVisor handler keeps a network): %w", k.NetworkRuntimeClass, err)
		}
	}
	if n, err := SweepExpired(cctx, cs, k.Namespace, time.Now()); err != nil {
		log.Warn("kubernetes backend: sweep of dead instances failed", "err", err)
	} else if n > 0 {
		log.Info("kubernetes backend: removed the leases (and so the pods) of dead instances", "count", n)
	}
	var netOpts *NetOptions
	if cfg.NetworkOffered() {
		if netOpts, err = upEgress(cfg, log); err != nil {
			return nil, err
		}
	}
	mon, err := monitorOptions(cfg, log)
	if err != nil {
		if netOpts != nil {
			_ = netOpts.Proxy.Close()
		}
		return nil, err
	}
	l := cfg.Limits
	m, err := New(ctx, Options{
		Client: cs, REST: rc, Namespace: k.Namespace, InstanceID: runtime.NewRunID(), Address: cfg.Server.Advertise,
		Image: k.SandboxImage(cfg.Image), RuntimeClass: k.RuntimeClass,
		NodeSelector: k.NodeSelector, Tolerations: tolerations(k), SchedulerName: k.SchedulerName,
		ScheduleTimeout: k.ScheduleTimeout, LeaseDuration: k.LeaseDuration,
		UID: uint32(cfg.Sandbox.UID), GID: uint32(cfg.Sandbox.GID),
		Env:      cfg.Sandbox.Env,
		PoolSize: cfg.Pool.Size, PoolLimits: l.RunLimits(0), PoolPreload: cfg.Pool.Preload, PoolMaxIdle: cfg.Pool.MaxIdleAge,
		MaxTimeout:  time.Duration(l.MaxTimeoutS) * time.Second,
		Concurrency: l.Concurrency, Queue: l.Queue, QueueWait: time.Duration(l.QueueWaitS) * time.Second,
		Breaker: runtime.BreakerOptions{Failures: cfg.Breaker.Failures, Window: cfg.Breaker.Window, Cooldown: cfg.Breaker.Cooldown},
		Net:     netOpts,
		Monitor: mon,
		Log:     log,
	})
	if err != nil && netOpts != nil {
		_ = netOpts.Proxy.Close()
	}
	return m, err
}

// upEgress starts this replica's egress proxy (the host backend's code:
// the same refusals and the same egress_denied) on
// kubernetes.egress_listen, and says how networked pods reach it.
func upEgress(cfg config.Config, log *slog.Logger) (*NetOptions, error) {
	nc, k := cfg.Network, cfg.Kubernetes
	st, err := egress.FromSettings(egress.Settings{Domains: nc.AllowDomains, Ports: nc.AllowPorts, CIDRs: nc.AllowCIDRs,
		Hosts: nc.HostMap(), AllowPrivate: nc.AllowPrivate, CAFile: nc.CAFile, Allow: nc.Allow, Secrets: cfg.Secrets,
		Tripwires: nc.Tripwires, StateDir: cfg.StateDir, Logger: log.With("component", "egress")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", k.EgressListen)
	if err != nil {
		return nil, fmt.Errorf("egress proxy: listen on kubernetes.egress_listen %s: %w", k.EgressListen, err)
	}
	addr, err := proxyAddress(k.EgressAddress, os.Getenv("POD_IP"), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	go func() { _ = st.Proxy.Serve(ln) }()
	log.Info("egress proxy listening", "listen", ln.Addr().String(), "advertised", addr.String(), "domains", st.Policy.Domains())
	return &NetOptions{RuntimeClass: k.NetworkRuntimeClass, Proxy: st.Proxy, Policy: st.Policy, Addr: addr, CABundle: st.CABundle, Secrets: st.Secrets, Tripwires: st.Tripwires}, nil
}

// proxyAddress is where networked pods reach this replica's proxy:
// kubernetes.egress_address, or else the pod's own address; an IP alone
// takes the port the proxy listens on.
func proxyAddress(configured, podIP string, port int) (netip.AddrPort, error) {
	addr := configured
	if addr == "" {
		if addr = podIP; addr == "" {
			return netip.AddrPort{}, errors.New("kubernetes.egress_address is empty and $POD_IP is not set (the Deployment sets it from the downward API; outside a pod, set the address networked pods reach this airlock at)")
		}
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap, nil
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("kubernetes.egress_address (or $POD_IP) must be an IP address, with or without a port, not %q: pods have no resolver", addr)
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

// Ready reports whether the cluster answers and this instance's Lease is
// there.
func (m *Manager) Ready(ctx context.Context) error {
	_, err := m.o.Client.CoordinationV1().Leases(m.o.Namespace).Get(ctx, m.lease.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubernetes API: %w", err)
	}
	return nil
}

// InstanceID names this airlock process on the cluster.
func (m *Manager) InstanceID() string { return m.o.InstanceID }

// tolerations are kubernetes.tolerations as the API's type.
func tolerations(k config.KubernetesConfig) []corev1.Toleration {
	tol := make([]corev1.Toleration, 0, len(k.Tolerations))
	for _, t := range k.Tolerations {
		tol = append(tol, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	return tol
}

// monitorOptions is runtime monitoring on the cluster: on when monitor is
// enabled and the nodes run the agent (kubernetes.monitor_agent_port).
func monitorOptions(cfg config.Config, log *slog.Logger) (*MonitorOptions, error) {
	k := cfg.Kubernetes
	if !cfg.Monitor.Enabled {
		return nil, nil
	}
	if k.MonitorAgentPort == 0 {
		log.Info("kubernetes backend: runtime monitoring is off on the cluster (it needs `airlock monitor-agent` on the nodes and kubernetes.monitor_agent_port; see the README)")
		return nil, nil
	}
	b, err := os.ReadFile(k.MonitorAgentTokenFile)
	if err != nil {
		return nil, fmt.Errorf("kubernetes.monitor_agent_token_file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if err := agent.TokenOK(token); err != nil {
		return nil, fmt.Errorf("kubernetes.monitor_agent_token_file %s: %w", k.MonitorAgentTokenFile, err)
	}
	declareKinds()
	return &MonitorOptions{Port: k.MonitorAgentPort, Token: token, KillOn: cfg.Monitor.KillOn}, nil
}
