package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/exchange"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// pod is one sandbox pod and the attach stream to its driver. It
// implements exchange.Sandbox.
type pod struct {
	m       *Manager
	name    string
	log     *slog.Logger
	st      *exchange.Stream
	diag    *runtime.CappedBuffer
	stdinW  *io.PipeWriter
	stdoutW *io.PipeWriter
	cancel  context.CancelFunc // ends the attach stream
	created time.Time
	steps   map[string]float64
	// ip is the pod's address once it runs (waitRunning).
	ip string
	// token is this attach's, echoed in the driver's Hello; a Hello with
	// another token means another airlock attached (a session taken
	// over): foreign is set, and this end detaches.
	token   string
	foreign atomic.Bool
	// unregister, while set, lets the pod's address go from this
	// replica's egress proxy (letGo).
	unregister atomic.Pointer[func()]
	// tripped: the proxy saw one of the run's tripwires and airlock
	// deleted the pod (tripwire.go).
	tripped atomic.Bool
	// watch is the pod's runtime monitoring (nil: none); see monitor.go.
	watch *podWatch

	mu         sync.Mutex
	terminated *corev1.ContainerStateTerminated
	destroyed  bool
}

// helloTimeout bounds the wait for the driver once the pod runs.
const helloTimeout = 60 * time.Second

// attachRepeat is how often the attach frame is repeated until the driver
// answers: the runtime may wire the attacher's stdin a moment before its
// stdout, and a Hello written in between reaches nobody.
const attachRepeat = 250 * time.Millisecond

// teardownTimeout bounds the deletion of a pod after its run.
const teardownTimeout = 2 * time.Minute

func (p *pod) step(name string) {
	p.steps[name] = runtime.Millis(time.Since(p.created))
}

// newPod is the host's end of the pod name, not yet attached.
func (m *Manager) newPod(name string, log *slog.Logger) *pod {
	return &pod{m: m, name: name, st: exchange.NewStream(), diag: runtime.NewCappedBuffer(8<<10, nil), created: time.Now(), steps: map[string]float64{}, log: log}
}

// policy is the pod of a sandbox of this manager: a cold one for a run
// as it is; a warm one (Preload) or a session's adds to it.
func (m *Manager) policy(name string, labels map[string]string, lim runtime.Limits, deadline time.Duration) PodPolicy {
	all := map[string]string{LabelManagedBy: ManagedBy, LabelInstance: m.o.InstanceID}
	for k, v := range labels {
		all[k] = v
	}
	return PodPolicy{
		Name: name, Namespace: m.o.Namespace, Labels: all,
		Owner: m.lease.owner(),
		Image: m.o.Image, RuntimeClass: m.o.RuntimeClass,
		UID: m.o.UID, GID: m.o.GID,
		Env:    runtime.BuildEnv(m.o.Env),
		Limits: lim,
		// A backstop only: airlock deletes the pod at the run's deadline.
		DeadlineSeconds: int64(deadline / time.Second),
		NodeSelector:    m.o.NodeSelector, Tolerations: m.o.Tolerations, SchedulerName: m.o.SchedulerName,
	}
}

// startPod creates the pod of a run, waits for it to run, attaches to its
// driver and waits for its hello. On error the pod is deleted.
func (m *Manager) startPod(ctx context.Context, runID string, lim runtime.Limits, pol *egress.Policy) (*pod, error) {
	pp := m.policy("airlock-"+runID, map[string]string{LabelRun: runID}, lim, lim.Timeout+m.o.ScheduleTimeout+helloTimeout+time.Minute)
	var reg *registration
	if pol != nil {
		m.networked(&pp, m.o.Net.URL())
		pp.EgressProxy = m.o.Net.Addr.String()
		reg = &registration{id: runID, pol: *pol}
	}
	spec, err := Pod(pp)
	if err != nil {
		return nil, err
	}
	return m.startSpec(ctx, spec, lim, reg, m.o.Log.With("pod", spec.Name, "run", runID))
}

// registration is what a networked pod is let through this replica's
// egress proxy under: its run's or session's id (which its refusals are
// kept under) and allow-list.
type registration struct {
	id  string
	pol egress.Policy
}

// networked makes pp a networked pod's: gVisor with a network, marked for
// the NetworkPolicy that lets it reach the proxy, told the proxy is at
// proxyURL, and holding the code back until the namespace's policy is in
// force for it.
func (m *Manager) networked(pp *PodPolicy, proxyURL string) {
	pp.RuntimeClass = m.o.Net.RuntimeClass
	pp.AwaitFence = true
	pp.Labels[LabelNetwork] = "allowlist"
	pp.Env = runtime.BuildEnv(m.o.Env, runtime.ProxyEnv(proxyURL, len(m.o.Net.CABundle) > 0))
}

// startSpec creates the pod spec describes, waits for it to run, attaches
// to its driver and waits for its hello. On error the pod is deleted.
//
// A networked pod (reg set) is registered with this replica's proxy once
// it has its address and before the attach: its driver, at the attach,
// makes sure it can reach the proxy, which must know it by then.
func (m *Manager) startSpec(ctx context.Context, spec *corev1.Pod, lim runtime.Limits, reg *registration, log *slog.Logger) (_ *pod, err error) {
	p := m.newPod(spec.Name, log)
	if _, err := m.o.Client.CoreV1().Pods(m.o.Namespace).Create(ctx, spec, metav1.CreateOptions{}); err != nil {
		return nil, createError(err, lim)
	}
	p.step("created")
	defer func() {
		if err != nil {
			p.destroy()
		}
	}()
	if err := p.waitRunning(ctx, false, m.o.ScheduleTimeout); err != nil {
		return nil, err
	}
	p.step("running")
	if reg != nil {
		if err := m.register(p, reg.id, reg.pol); err != nil {
			return nil, err
		}
	}
	if err := p.attach(ctx); err != nil {
		return nil, err
	}
	p.step("hello")
	return p, nil
}

// createError says why the API server refused a pod, in words that name
// the fix.
func createError(err error, lim runtime.Limits) error {
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota") {
		return runtime.Infra("create sandbox pod", fmt.Errorf("the namespace's ResourceQuota has no room for a sandbox of %d MiB and %g CPU (raise the quota, or lower the memory or CPU limit or limits.concurrency): %w", lim.MemoryBytes>>20, lim.CPUs, err))
	}
	return runtime.Infra("create sandbox pod", err)
}

// waitRunning watches the pod until its container runs (and, when ready is
// set, until the pod is Ready: a warm pod's driver has preloaded). A pod
// no node can take within kubernetes.schedule_timeout, an image the node
// does not have, or a container that ended already fails with the
// cluster's own words.
func (p *pod) waitRunning(ctx context.Context, ready bool, timeout time.Duration) error {
	o := p.m.o
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	w, err := o.Client.CoreV1().Pods(o.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.name).String()})
	if err != nil {
		return runtime.Infra("watch sandbox pod", err)
	}
	defer w.Stop()
	var last *corev1.Pod
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return runtime.Infra("sandbox pod not running", fmt.Errorf("after %v: %s", timeout, pending(last)))
		case ev, ok := <-w.ResultChan():
			if !ok {
				return runtime.Infra("watch sandbox pod", errors.New("the watch ended"))
			}
			if ev.Type == watch.Deleted {
				return runtime.Infra("sandbox pod", errors.New("deleted before it ran"))
			}
			po, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			last = po
			p.ip = po.Status.PodIP
			if cs := containerStatus(po); cs != nil {
				switch {
				case cs.State.Running != nil && (!ready || cs.Ready):
					return nil
				case cs.State.Terminated != nil:
					return runtime.Infra("sandbox pod", fmt.Errorf("its container ended before airlock attached: %s (exit %d) %s", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
				case cs.State.Waiting != nil && fatalWaiting[cs.State.Waiting.Reason]:
					return runtime.Infra("sandbox pod", fmt.Errorf("%s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message))
				}
			}
			if po.Status.Phase == corev1.PodFailed || po.Status.Phase == corev1.PodSucceeded {
				return runtime.Infra("sandbox pod", fmt.Errorf("ended before it ran: %s %s", po.Status.Reason, po.Status.Message))
			}
		}
	}
}

// fatalWaiting are container waiting reasons that no amount of waiting
// mends.
var fatalWaiting = map[string]bool{
	"ErrImageNeverPull": true, "InvalidImageName": true, "CreateContainerConfigError": true,
	"CreateContainerError": true, "RunContainerError": true, "ImagePullBackOff": true, "ErrImagePull": true,
}

// pending says why a pod is not running yet: the scheduler's words, and
// the size it could not place, when no node takes it.
func pending(po *corev1.Pod) string {
	if po == nil {
		return "the API server said nothing of the pod"
	}
	for _, c := range po.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			return fmt.Sprintf("no node can take a sandbox of %s: %s (lower the memory or CPU limit, add nodes, or raise kubernetes.schedule_timeout)", podSize(po), c.Message)
		}
	}
	if cs := containerStatus(po); cs != nil && cs.State.Waiting != nil {
		return fmt.Sprintf("container waiting: %s %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
	}
	return "pod " + string(po.Status.Phase)
}

// podSize is the memory and CPU the pod's sandbox container asks for.
func podSize(po *corev1.Pod) string {
	for _, c := range po.Spec.Containers {
		if c.Name == Container {
			return fmt.Sprintf("%d MiB and %g CPU", c.Resources.Limits.Memory().Value()>>20, c.Resources.Limits.Cpu().AsApproximateFloat64())
		}
	}
	return "unknown size"
}

func containerStatus(po *corev1.Pod) *corev1.ContainerStatus {
	for i := range po.Status.ContainerStatuses {
		if po.Status.ContainerStatuses[i].Name == Container {
			return &po.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// attach opens the pod's attach stream (WebSocket, SPDY when the server
// cannot upgrade to it) and waits for the driver's hello, repeating the
// attach frame until it comes.
func (p *pod) attach(ctx context.Context) error {
	o := p.m.o
	if err := p.watchAttempts(ctx); err != nil {
		return err
	}
	req := o.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(o.Namespace).Name(p.name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: Container, Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(o.REST, "GET", req.URL().String())
	if err != nil {
		return runtime.Infra("attach to sandbox pod", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(o.REST, "POST", req.URL())
	if err != nil {
		return runtime.Infra("attach to sandbox pod", err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return runtime.Infra("attach to sandbox pod", err)
	}
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	p.stdinW, p.stdoutW = stdinW, stdoutW
	p.st.SetInput(stdinW)
	// The stream lives as long as the pod: not bound to the caller's ctx,
	// which may end before the teardown.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	go func() {
		err := ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: stdinR, Stdout: stdoutW, Stderr: p.diag})
		if err != nil && sctx.Err() == nil {
			p.log.Debug("attach stream ended", "err", err)
		}
		stdoutW.Close()
		stdinR.Close()
	}()
	p.token = runtime.NewRunID()
	go p.st.Decode(stdoutR, p.sawHello, p.log)
	hctx, hcancel := context.WithTimeout(ctx, helloTimeout)
	defer hcancel()
	go func() {
		t := time.NewTicker(attachRepeat)
		defer t.Stop()
		for {
			if err := p.st.Send(driver.FrameAttach, []byte(p.token)); err != nil {
				return
			}
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	for {
		h, err := p.st.WaitHello(hctx, p.diagText)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return runtime.Infra("sandbox driver not ready", err)
		}
		if h.Attach == p.token {
			return nil
		}
	}
}

// letGo ends the pod's registration with this replica's egress proxy,
// once; nothing when it has none.
func (p *pod) letGo() {
	if f := p.unregister.Swap(nil); f != nil {
		(*f)()
	}
}

// sawHello notices a Hello that answers another host's attach.
func (p *pod) sawHello(h driver.Hello) {
	if h.Attach == "" || h.Attach == p.token {
		return
	}
	p.log.Info("another airlock attached to the sandbox pod; detaching")
	// Before foreign is seen set: whoever sees it may count on the
	// address being gone from this replica's proxy.
	p.letGo()
	p.foreign.Store(true)
	// Its output now goes to both; nobody would read this end's.
	p.cancel()
}

func (p *pod) diagText() string {
	d, _ := p.diag.Result()
	return d
}

// The exchange.Sandbox of a pod.

func (p *pod) Stream() *exchange.Stream { return p.st }

// Exited is nil: a pod's end is seen when its attach stream ends.
func (p *pod) Exited() <-chan struct{} { return nil }
func (p *pod) Diag() string            { return p.diagText() }
func (p *pod) Log() *slog.Logger       { return p.log }

// Stop ends the pod when kill is set (deleted at once, grace 0: every
// process in it gets SIGKILL), and waits, bounded, until its container
// has ended.
func (p *pod) Stop(kill bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	if p.violated() {
		// Deleted already, by kill_on: its status may be gone with it.
		return nil
	}
	if kill {
		p.delete(ctx)
		return nil
	}
	if _, err := p.waitTerminated(ctx, 30*time.Second); err != nil {
		return runtime.Infra("sandbox pod did not end", err)
	}
	return nil
}

// ExitStatus is the container's exit code once it has ended.
func (p *pod) ExitStatus() (int, error) {
	if p.violated() {
		return 128 + int(syscall.SIGKILL), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t, err := p.waitTerminated(ctx, 30*time.Second)
	if err != nil {
		return 0, err
	}
	return int(t.ExitCode), nil
}

// OutOfMemory reports what the kubelet says: a container ended by the
// memory limit is terminated with reason OOMKilled. A code exit the
// driver reported is judged by the same status, when the sandbox ended
// with it.
func (p *pod) OutOfMemory(exit int, d time.Duration) bool {
	if p.violated() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Second)
	defer cancel()
	t, err := p.waitTerminated(ctx, d)
	return err == nil && t.Reason == "OOMKilled"
}

// waitTerminated waits up to d for the container's terminated state.
func (p *pod) waitTerminated(ctx context.Context, d time.Duration) (*corev1.ContainerStateTerminated, error) {
	p.mu.Lock()
	t := p.terminated
	p.mu.Unlock()
	if t != nil {
		return t, nil
	}
	o := p.m.o
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	w, err := o.Client.CoreV1().Pods(o.Namespace).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.name).String()})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the container had not ended after %v", d)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("the watch ended")
			}
			po, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if cs := containerStatus(po); cs != nil && cs.State.Terminated != nil {
				p.mu.Lock()
				p.terminated = cs.State.Terminated.DeepCopy()
				t = p.terminated
				p.mu.Unlock()
				return t, nil
			}
			if ev.Type == watch.Deleted {
				return nil, errors.New("the pod was deleted")
			}
		}
	}
}

// delete asks for the pod's deletion with no grace period.
func (p *pod) delete(ctx context.Context) {
	grace := int64(0)
	err := p.m.o.Client.CoreV1().Pods(p.m.o.Namespace).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	if err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete sandbox pod", "err", err)
	}
}

// destroy deletes the pod and waits until the API server has let it go,
// then ends the stream; once, on every path.
func (p *pod) destroy() {
	// First: the address may be reused once the pod is gone.
	p.letGo()
	p.mu.Lock()
	if p.destroyed {
		p.mu.Unlock()
		return
	}
	p.destroyed = true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	p.delete(ctx)
	if err := p.waitGone(ctx); err != nil {
		p.log.Error("sandbox pod not gone", "err", err)
	}
	p.detach()
}

// detach ends the attach stream and leaves the pod as it is.
func (p *pod) detach() {
	p.stopWatching()
	if p.cancel != nil {
		p.cancel()
	}
	if p.stdinW != nil {
		p.stdinW.Close()
		p.stdoutW.Close()
	}
}

// waitGone waits until the pod no longer exists.
func (p *pod) waitGone(ctx context.Context) error {
	o := p.m.o
	pods := o.Client.CoreV1().Pods(o.Namespace)
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", p.name).String()})
	if err != nil {
		return err
	}
	defer w.Stop()
	// Gone before the watch began: nothing will come.
	if _, err := pods.Get(ctx, p.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return errors.New("the watch ended")
			}
			if ev.Type == watch.Deleted {
				return nil
			}
		}
	}
}
