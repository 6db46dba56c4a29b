package kube

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/monitor"
	"github.com/airlock-mcp/airlock/runtime/monitor/agent"
)

// MonitorOptions turn on runtime monitoring on the cluster: every node
// runs `airlock monitor-agent` on Port (host network), to which the
// sandbox RuntimeClasses' runsc reports.
type MonitorOptions struct {
	Port  int
	Token string
	// KillOn ends a run at the first attempt of one of these kinds.
	KillOn []string
}

// agentWait bounds the wait for a node's agent to open a pod's event
// stream: no code runs unwatched, so a pod whose agent does not answer
// fails its start.
const agentWait = 10 * time.Second

// podWatch is one pod's runtime monitoring: the agent of its node, its
// container, and the stream that ends the run at a kill_on attempt.
type podWatch struct {
	client      *agent.Client
	containerID string
	cancel      context.CancelFunc
	violated    atomic.Bool
}

// containerID is a container status's id without its runtime prefix
// ("containerd://...").
func containerID(cs *corev1.ContainerStatus) string {
	if cs == nil {
		return ""
	}
	_, id, ok := strings.Cut(cs.ContainerID, "://")
	if !ok {
		return cs.ContainerID
	}
	return id
}

// watchAttempts starts monitoring p before any code runs in it: it asks
// the pod's node agent to stream the container's attempts (for kill_on)
// and forgets what the container tried before (a warm pod's preload).
func (p *pod) watchAttempts(ctx context.Context) error {
	mo := p.m.o.Monitor
	if mo == nil {
		return nil
	}
	po, err := p.m.o.Client.CoreV1().Pods(p.m.o.Namespace).Get(ctx, p.name, metav1.GetOptions{})
	if err != nil {
		return runtime.Infra("runtime monitoring: read the sandbox pod", err)
	}
	id, host := containerID(containerStatus(po)), po.Status.HostIP
	if id == "" || host == "" {
		return runtime.Infra("runtime monitoring", fmt.Errorf("pod %s has no container id or node address yet", p.name))
	}
	w := &podWatch{client: &agent.Client{Base: "http://" + net.JoinHostPort(host, strconv.Itoa(mo.Port)), Token: mo.Token}, containerID: id}
	kill := map[string]bool{}
	for _, k := range mo.KillOn {
		kill[k] = true
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = cancel
	ready := make(chan struct{})
	failed := make(chan error, 1)
	go func() {
		err := w.client.Watch(sctx, id, ready, func(e agent.StreamEvent) {
			if kill[e.Kind] && w.violated.CompareAndSwap(false, true) {
				p.log.Warn("sandbox attempt in monitor.kill_on: ending the run", "kind", e.Kind, "syscall", e.Syscall)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
					defer cancel()
					p.delete(ctx)
				}()
			}
		})
		if err != nil {
			failed <- err
			select {
			case <-ready: // it was open: it broke
			default:
				return // it never opened: the start fails and says why
			}
			if sctx.Err() == nil {
				p.log.Warn("runtime monitoring: the node agent's stream broke; kill_on no longer applies to this sandbox", "err", err)
			}
		}
	}()
	timer := time.NewTimer(agentWait)
	defer timer.Stop()
	select {
	case <-ready:
	case err := <-failed:
		cancel()
		return runtime.Infra("runtime monitoring: the node's agent (kubernetes.monitor_agent_port; is `airlock monitor-agent` running on "+po.Spec.NodeName+"?)", err)
	case <-timer.C:
		cancel()
		return runtime.Infra("runtime monitoring", fmt.Errorf("the agent on node %s (%s) did not answer in %v", po.Spec.NodeName, w.client.Base, agentWait))
	}
	if _, err := w.client.Take(ctx, id); err != nil {
		cancel()
		return runtime.Infra("runtime monitoring", err)
	}
	p.watch = w
	return nil
}

// violated reports whether airlock deleted the pod itself: at a kill_on
// attempt, or at a tripwire.
func (p *pod) violated() bool {
	return p.tripped.Load() || p.watch != nil && p.watch.violated.Load()
}

// stopWatching ends the event stream (the pod is going or left).
func (p *pod) stopWatching() {
	if p.watch != nil {
		p.watch.cancel()
	}
}

// noteAttempts puts into res what runtime monitoring saw during the run,
// and names a kill_on kill as such (a session's is over).
func (p *pod) noteAttempts(res *runtime.Result, err error, session bool) error {
	if p.tripped.Load() && res.KilledBy(runtime.ReasonTripwire, session, err) {
		err = nil
	}
	w := p.watch
	if w == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, terr := w.client.Take(ctx, w.containerID)
	switch {
	case terr != nil:
		p.log.Warn("runtime monitoring: could not ask the node agent what the code tried; this result lists no attempts", "err", terr)
	case !tr.Synced:
		p.log.Warn("runtime monitoring: the sandbox's events were not all read in time; this result may list fewer attempts")
	}
	if len(tr.Attempts) > 0 {
		res.Attempts = tr.Attempts
		for _, a := range tr.Attempts {
			for range a.Count {
				metrics.Escapes.Inc(a.Kind)
			}
		}
	}
	if w.violated.Load() && !p.tripped.Load() && res.KilledBy(runtime.ReasonPolicyViolation, session, err) {
		return nil
	}
	return err
}

// declareKinds makes every attempt kind show in the metrics at zero.
func declareKinds() {
	for _, k := range monitor.Kinds() {
		metrics.Escapes.Declare(string(k))
	}
}
