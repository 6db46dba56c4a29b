package kube

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
	"github.com/airlock-mcp/airlock/runtime/exchange"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

// A session pod outlives the airlock that opened it: it has no owner (an
// instance's Lease would take it along), and its record is on the pod
// itself, so that another airlock on the namespace can serve its next
// call. The holder is the instance in the pod's LabelInstance; every call
// begins with an update of the pod at the version the holder last saw,
// so a holder that was replaced learns it before it touches the sandbox.
// Pods no airlock serves end by the idle deadline recorded here (any
// instance's sweep deletes them) or, at the latest, by the pod's own
// activeDeadlineSeconds at the session's lifetime.
const (
	annOwner     = "airlock.dev/session-owner"
	annIdle      = "airlock.dev/session-idle-s"
	annCalls     = "airlock.dev/session-calls"
	annIdleUntil = "airlock.dev/idle-until"
	// annBusyUntil is set while a call runs: until then no other airlock
	// takes the session over (its holder may be alive and mid-call).
	annBusyUntil = "airlock.dev/busy-until"
	// annEgress is a networked session's allow-list (its domains, comma
	// separated), so that whichever airlock takes it over lets it through
	// the same.
	annEgress = "airlock.dev/session-egress"
	// annCredentials marks a session given secrets or tripwires. Their
	// placeholders and fake values live only in the airlock that opened
	// it, so no other can serve it as it was: a takeover ends it instead
	// of carrying on with placeholders unfilled and tripwires unwatched.
	annCredentials = "airlock.dev/session-credentials"
)

// SessionRelay is where a networked session's code finds its proxy: the
// driver's relay on the pod's loopback, which follows the session from
// holder to holder (each says where its proxy is with FrameEgress). A
// pod's environment is fixed at its start, and code caches what it read.
const SessionRelay = "127.0.0.1:3128"

// busySlack is added to a call's timeout for its busy mark: the interrupt
// and the answer take a moment past the timeout.
const busySlack = exchange.InterruptWait + 10*time.Second

// errTakenOver says another airlock holds the session now.
var errTakenOver = errors.New("another airlock serves this session now")

// session is one session pod and this instance's hold on it. One call at
// a time.
type session struct {
	m    *Manager
	p    *pod
	id   string
	idle time.Duration

	mu     sync.Mutex
	obj    *corev1.Pod // as last written or read
	closed bool
	// lost is read without mu: the reaper asks while a call holds it.
	lost atomic.Bool

	// A networked session's allow-list and the files its calls get (pip's
	// configuration, the CA bundle). The pod's registration with this
	// replica's proxy goes when this replica lets go of the pod.
	egress *egress.Policy
	files  map[string][]byte
	// env and homeFiles go with every call (SessionOptions); kept in this
	// process only, never on the pod, where anyone who may read pods
	// would see them.
	env, homeFiles map[string]string
}

// OpenSession starts a session in a pod of its own, never a warm one: a
// warm pod's deadline is a run's and may only go down.
func (m *Manager) OpenSession(ctx context.Context, o runtime.SessionOptions) (runtime.Session, error) {
	networked := o.Egress != nil
	if networked && m.o.Net == nil {
		return nil, errors.New("runtime: this airlock offers no networked sessions on the cluster (set kubernetes.network_runtime_class and network.allow_domains)")
	}
	if o.Lifetime <= 0 {
		o.Lifetime = 2 * time.Hour
	}
	if o.Idle <= 0 || o.Idle > o.Lifetime {
		o.Idle = o.Lifetime
	}
	if err := runtime.CheckOverlay(o.Env, o.HomeFiles); err != nil {
		return nil, err
	}
	now := time.Now()
	pol := m.policy("airlock-"+o.ID, map[string]string{LabelSession: o.ID}, o.Limits, o.Lifetime+m.o.ScheduleTimeout+helloTimeout+time.Minute)
	pol.Session = true
	pol.Owner = metav1.OwnerReference{} // it outlives this instance
	pol.Annotations = map[string]string{
		annOwner: o.Owner, annIdle: strconv.Itoa(int(o.Idle / time.Second)), annCalls: "0",
		// Room for the start; the first call moves it on.
		annIdleUntil: stamp(now.Add(o.Idle + m.o.ScheduleTimeout + helloTimeout)),
	}
	var reg *registration
	if networked {
		m.networked(&pol, "http://"+SessionRelay)
		pol.EgressProxy, pol.EgressRelay = m.o.Net.Addr.String(), SessionRelay
		pol.Annotations[annEgress] = strings.Join(o.Egress.Domains(), ",")
		if o.Egress.HasCredentials() {
			pol.Annotations[annCredentials] = "held by " + m.o.InstanceID
		}
		reg = &registration{id: o.ID, pol: *o.Egress}
	}
	spec, err := Pod(pol)
	if err != nil {
		return nil, err
	}
	var p *pod
	err = m.breaker.Guard(ctx, func() error {
		p, err = m.startSpec(ctx, spec, o.Limits, reg, m.o.Log.With("pod", spec.Name, "session", o.ID))
		return err
	})
	if err != nil {
		return nil, err
	}
	ss := &session{m: m, p: p, id: o.ID, idle: o.Idle, env: o.Env, homeFiles: o.HomeFiles}
	if networked {
		ss.networked(*o.Egress)
	}
	if err := p.st.Send(driver.FrameSession, nil); err != nil {
		m.teardowns.Start(p.destroy, nil)
		return nil, runtime.Infra("start session", err)
	}
	if ss.obj, err = m.o.Client.CoreV1().Pods(m.o.Namespace).Get(ctx, p.name, metav1.GetOptions{}); err != nil {
		m.teardowns.Start(p.destroy, nil)
		return nil, runtime.Infra("read session pod", err)
	}
	return ss, nil
}

// AdoptSession implements runtime.SessionAdopter: it finds the session's
// pod by its labels, makes this instance its holder (an update at the
// version read, so of two airlocks taking one session exactly one
// succeeds) and attaches to its driver, whose interpreter kept its state.
// A session in a call on another airlock is not taken.
func (m *Manager) AdoptSession(ctx context.Context, id, owner string) (runtime.Session, runtime.SessionRecord, error) {
	var rec runtime.SessionRecord
	pods := m.o.Client.CoreV1().Pods(m.o.Namespace)
	for attempt := 0; attempt < 4; attempt++ {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: fmt.Sprintf("%s=%s,%s=%s", LabelManagedBy, ManagedBy, LabelSession, id)})
		if err != nil {
			return nil, rec, runtime.Infra("find session pod", err)
		}
		var po *corev1.Pod
		for i := range list.Items {
			if it := &list.Items[i]; it.DeletionTimestamp == nil && it.Status.Phase == corev1.PodRunning {
				po = it
			}
		}
		// Another client's session reads as none, as locally.
		if po == nil || po.Annotations[annOwner] != owner {
			return nil, rec, runtime.ErrNoSession
		}
		now := time.Now()
		if busy, ok := parseStamp(po.Annotations[annBusyUntil]); ok && now.Before(busy) && po.Labels[LabelInstance] != m.o.InstanceID {
			return nil, rec, fmt.Errorf("%w on another airlock until %s", runtime.ErrSessionBusy, busy.UTC().Format(time.RFC3339))
		}
		idle := time.Duration(atoi(po.Annotations[annIdle])) * time.Second
		if idle <= 0 {
			return nil, rec, runtime.ErrNoSession
		}
		if held := po.Annotations[annCredentials]; held != "" {
			// Ended, not left to its idle deadline: nobody can serve it.
			grace := int64(0)
			if err := pods.Delete(ctx, po.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
				m.o.Log.Warn("end a session no airlock can serve", "session", id, "err", err)
			}
			return nil, rec, fmt.Errorf("it was given secrets or tripwires, which only the airlock that opened it held (%s), so no other can serve it; it has been ended: open another with session_create", held)
		}
		var pol *egress.Policy
		if po.Labels[LabelNetwork] != "" {
			if pol, err = m.sessionPolicy(po); err != nil {
				return nil, rec, err
			}
		}
		po.Labels[LabelInstance] = m.o.InstanceID
		po.Annotations[annIdleUntil] = stamp(now.Add(idle))
		delete(po.Annotations, annBusyUntil)
		upd, err := pods.Update(ctx, po, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			return nil, rec, runtime.ErrNoSession
		case err != nil:
			return nil, rec, runtime.Infra("take over session pod", err)
		}
		p := m.newPod(po.Name, m.o.Log.With("pod", po.Name, "session", id))
		p.ip = po.Status.PodIP
		ss := &session{m: m, p: p, id: id, idle: idle, obj: upd}
		if err := p.attach(ctx); err != nil {
			// Left as it is: its idle deadline ends it if nobody serves it.
			p.detach()
			return nil, rec, err
		}
		if pol != nil {
			// Let the pod through this replica's proxy, then point its
			// relay here.
			err := m.register(p, id, *pol)
			if err == nil {
				ss.networked(*pol)
				err = p.st.Send(driver.FrameEgress, []byte(m.o.Net.Addr.String()))
			}
			if err != nil {
				p.letGo()
				p.detach()
				return nil, rec, runtime.Infra("take over networked session", err)
			}
		}
		// Idempotent: a driver already serving the session ignores it.
		if err := p.st.Send(driver.FrameSession, nil); err != nil {
			p.letGo()
			p.detach()
			return nil, rec, runtime.Infra("take over session", err)
		}
		rec = runtime.SessionRecord{Owner: owner, Created: po.CreationTimestamp.Time, Idle: idle, Calls: atoi(po.Annotations[annCalls]), Egress: pol}
		return ss, rec, nil
	}
	return nil, rec, runtime.Infra("take over session pod", errors.New("it kept changing under this airlock; retry"))
}

// networked records the session's allow-list, registered with this
// replica's proxy, and gives its calls the proxy's files.
func (ss *session) networked(pol egress.Policy) {
	ss.egress = &pol
	ss.files = runtime.ProxyFiles("http://"+SessionRelay, ss.m.o.Net.CABundle)
}

// sessionPolicy rebuilds a networked session's allow-list from its pod:
// the domains this replica's list covers, narrowed from it (so its ports
// and CIDRs apply), and the rest as a human granted them when the session
// began.
func (m *Manager) sessionPolicy(po *corev1.Pod) (*egress.Policy, error) {
	if m.o.Net == nil {
		return nil, errors.New("this airlock offers no networked sessions (kubernetes.network_runtime_class and network.allow_domains), and the session has a network")
	}
	var covered, granted []string
	for _, d := range strings.Split(po.Annotations[annEgress], ",") {
		if d == "" {
			continue
		}
		ok, err := m.o.Net.Policy.Covers(d)
		if err != nil {
			return nil, fmt.Errorf("session pod %s: allow-list entry %q: %w", po.Name, d, err)
		}
		if ok {
			covered = append(covered, d)
		} else {
			granted = append(granted, d)
		}
	}
	pol, err := m.o.Net.Policy.Narrow(covered)
	if err == nil {
		pol, err = pol.Widen(granted)
	}
	if err != nil {
		return nil, fmt.Errorf("session pod %s: allow-list: %w", po.Name, err)
	}
	return &pol, nil
}

// ID is the session's id.
func (ss *session) ID() string { return ss.id }

// Run runs one call in the session, holding a sandbox slot for it as any
// run does.
func (ss *session) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if !ss.mu.TryLock() {
		return runtime.Result{RunID: req.RunID}, runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if req.RunID == "" {
		req.RunID = runtime.NewRunID()
	}
	res := runtime.Result{RunID: req.RunID}
	if ss.closed {
		return res, runtime.ErrSessionClosed
	}
	release, err := ss.m.admission.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer release()
	start := time.Now()
	if err := ss.begin(ctx, req.Limits.Timeout); err != nil {
		return res, err
	}
	res, err = exchange.Run(ctx, ss.p, runtime.OverlayRequest(req, ss.env, ss.homeFiles), ss.files, true)
	err = ss.p.noteAttempts(&res, err, true)
	if ss.egress != nil {
		res.EgressDenied = ss.m.o.Net.Proxy.TakeDenials(ss.id)
	}
	ss.end()
	ss.m.o.Log.Info("session run finished", "backend", "kubernetes", "session", ss.id, "run", req.RunID, "lang", req.Language,
		"exit", res.ExitCode, "reason", res.Reason, "lost", res.SessionLost, "took", res.Duration, "total", time.Since(start))
	if res.SessionLost || ss.p.foreign.Load() {
		res.SessionLost = true
		ss.lost.Store(true)
		ss.closeLocked()
	}
	return res, err
}

// File does one file operation in the session's /workspace, as the code's
// user, inside the sandbox.
func (ss *session) File(ctx context.Context, op driver.FileOp) (driver.FileResult, error) {
	if !ss.mu.TryLock() {
		return driver.FileResult{}, runtime.ErrSessionBusy
	}
	defer ss.mu.Unlock()
	if ss.closed {
		return driver.FileResult{}, runtime.ErrSessionClosed
	}
	if err := ss.begin(ctx, exchange.FileOpTimeout); err != nil {
		return driver.FileResult{}, err
	}
	defer ss.end()
	res, err := ss.p.st.FileOp(ctx, op)
	if errors.Is(err, exchange.ErrStreamEnded) {
		ss.lost.Store(true)
		ss.closeLocked()
	}
	return res, err
}

// begin records a call of up to d on the pod: busy until it can have
// ended, idle from then. It fails, and the session ends here, when
// another airlock took the session over or its pod is gone.
func (ss *session) begin(ctx context.Context, d time.Duration) error {
	now := time.Now()
	err := ss.update(ctx, func(po *corev1.Pod) {
		po.Annotations[annBusyUntil] = stamp(now.Add(d + busySlack))
		po.Annotations[annIdleUntil] = stamp(now.Add(d + busySlack + ss.idle))
		po.Annotations[annCalls] = strconv.Itoa(atoi(po.Annotations[annCalls]) + 1)
	})
	if err == nil {
		return nil
	}
	ss.lost.Store(true)
	ss.closeLocked()
	if errors.Is(err, errTakenOver) || errors.Is(err, runtime.ErrSessionClosed) {
		return fmt.Errorf("%w: %v", runtime.ErrSessionClosed, err)
	}
	return err
}

// end records that the call is over: idle from now.
func (ss *session) end() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	err := ss.update(ctx, func(po *corev1.Pod) {
		delete(po.Annotations, annBusyUntil)
		po.Annotations[annIdleUntil] = stamp(now.Add(ss.idle))
	})
	if err != nil {
		ss.p.log.Warn("record the end of a session call", "err", err)
	}
}

// update writes mutate's change to the pod at the version this instance
// last saw, re-reading it on a conflict (the kubelet writes the status
// too): errTakenOver when another instance holds it now.
func (ss *session) update(ctx context.Context, mutate func(*corev1.Pod)) error {
	pods := ss.m.o.Client.CoreV1().Pods(ss.m.o.Namespace)
	for attempt := 0; attempt < 5; attempt++ {
		if ss.p.foreign.Load() || ss.obj.Labels[LabelInstance] != ss.m.o.InstanceID {
			return errTakenOver
		}
		if ss.obj.DeletionTimestamp != nil {
			return fmt.Errorf("%w: its pod is being deleted", runtime.ErrSessionClosed)
		}
		po := ss.obj.DeepCopy()
		if po.Annotations == nil {
			po.Annotations = map[string]string{}
		}
		mutate(po)
		upd, err := pods.Update(ctx, po, metav1.UpdateOptions{})
		if err == nil {
			ss.obj = upd
			return nil
		}
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: its pod is gone", runtime.ErrSessionClosed)
		}
		if !apierrors.IsConflict(err) {
			return runtime.Infra("update session pod", err)
		}
		cur, err := pods.Get(ctx, ss.obj.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: its pod is gone", runtime.ErrSessionClosed)
		}
		if err != nil {
			return runtime.Infra("read session pod", err)
		}
		ss.obj = cur
	}
	return runtime.Infra("update session pod", errors.New("it kept changing"))
}

// Lost reports whether the session ended on its own, or went to another
// airlock.
func (ss *session) Lost() bool {
	return ss.lost.Load() || ss.p.foreign.Load()
}

// Close ends the session: its pod is deleted, unless another airlock
// holds it now, when this one only lets go. It waits for a call in
// progress.
func (ss *session) Close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.closeLocked()
}

func (ss *session) closeLocked() {
	if ss.closed {
		return
	}
	ss.closed = true
	ss.m.teardowns.Start(ss.destroy, nil)
}

// destroy deletes the session's pod if this instance still holds it: the
// delete carries the version judged, and a conflict is judged again. The
// pod's address leaves this replica's proxy first: it may be reused.
func (ss *session) destroy() {
	ss.p.letGo()
	defer ss.p.detach()
	ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
	defer cancel()
	pods := ss.m.o.Client.CoreV1().Pods(ss.m.o.Namespace)
	grace := int64(0)
	po := ss.obj
	for attempt := 0; attempt < 5; attempt++ {
		if ss.p.foreign.Load() || po.Labels[LabelInstance] != ss.m.o.InstanceID {
			return
		}
		err := pods.Delete(ctx, po.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace,
			Preconditions: &metav1.Preconditions{UID: &po.UID, ResourceVersion: &po.ResourceVersion}})
		switch {
		case err == nil:
			if err := ss.p.waitGone(ctx); err != nil {
				ss.p.log.Error("session pod not gone", "err", err)
			}
			return
		case apierrors.IsNotFound(err):
			return
		case !apierrors.IsConflict(err):
			ss.p.log.Warn("delete session pod", "err", err)
			return
		}
		if po, err = pods.Get(ctx, po.Name, metav1.GetOptions{}); err != nil {
			return
		}
	}
}

// SweepSessions deletes the session pods no airlock serves any more: idle
// past their deadline by more than slack (the holder ends its own; the
// slack covers clocks that differ), or ended (their lifetime's deadline
// passed). Each delete carries the version judged, so a session taken up
// meanwhile stays. It returns how many it deleted.
func SweepSessions(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time, slack time.Duration) (int, error) {
	sel := fmt.Sprintf("%s=%s,%s", LabelManagedBy, ManagedBy, LabelSession)
	return deleteSessionPods(ctx, client, namespace, sel, func(po *corev1.Pod) bool { return sessionAbandoned(po, now, slack) })
}

// deleteSessionPods deletes the session pods that sel selects and judge
// condemns, each at the version judged: a session adopted or used
// meanwhile stays. It returns how many it deleted.
func deleteSessionPods(ctx context.Context, client kubernetes.Interface, namespace, sel string, judge func(*corev1.Pod) bool) (int, error) {
	pods := client.CoreV1().Pods(namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return 0, fmt.Errorf("list session pods: %w", err)
	}
	n := 0
	grace := int64(0)
	for _, po := range list.Items {
		if po.DeletionTimestamp != nil || !judge(&po) {
			continue
		}
		err := pods.Delete(ctx, po.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace,
			Preconditions: &metav1.Preconditions{UID: &po.UID, ResourceVersion: &po.ResourceVersion}})
		if err == nil {
			n++
		} else if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, fmt.Errorf("delete session pod %s: %w", po.Name, err)
		}
	}
	return n, nil
}

// sessionAbandoned judges a session pod: ended, or idle and not busy past
// its deadlines by more than slack. One without a readable idle deadline
// was not written by airlock's session code and is left alone.
func sessionAbandoned(po *corev1.Pod, now time.Time, slack time.Duration) bool {
	if po.Status.Phase == corev1.PodFailed || po.Status.Phase == corev1.PodSucceeded {
		return true
	}
	idle, ok := parseStamp(po.Annotations[annIdleUntil])
	if !ok || now.Before(idle.Add(slack)) {
		return false
	}
	busy, ok := parseStamp(po.Annotations[annBusyUntil])
	return !ok || now.After(busy.Add(slack))
}

// sweep removes what dead instances and abandoned sessions left; it runs
// after each renewal of this instance's Lease.
func (m *Manager) sweep(ctx context.Context) {
	now := time.Now()
	if n, err := SweepExpired(ctx, m.o.Client, m.o.Namespace, now); err != nil {
		m.o.Log.Warn("sweep dead instances", "err", err)
	} else if n > 0 {
		m.o.Log.Info("removed the leases (and so the pods) of dead instances", "count", n)
	}
	if n, err := SweepSessions(ctx, m.o.Client, m.o.Namespace, now, m.o.LeaseDuration); err != nil {
		m.o.Log.Warn("sweep abandoned sessions", "err", err)
	} else if n > 0 {
		m.o.Log.Info("removed abandoned session pods", "count", n)
	}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func parseStamp(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
