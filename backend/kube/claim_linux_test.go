package kube

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Two claimers (two replicas) racing with many claims at once over fewer
// ready pods than claims: every pod is claimed exactly once, labelled for
// the claim that got it, owned by its claimer's Lease; the claims left
// over get nothing; a pod of another shape, and one not ready, are never
// taken.
func TestClaimersRace(t *testing.T) {
	cs, _ := needCluster(t)
	ns := testNamespace(t, cs)
	ctx := context.Background()
	const ready, perClaimer = 24, 20
	mk := func(name string, labels map[string]string) {
		t.Helper()
		p, err := Pod(PodPolicy{Name: name, Namespace: ns, Labels: labels, Image: testImage, RuntimeClass: "gvisor",
			UID: 1000, GID: 1000, Limits: testLimits(), DeadlineSeconds: 600,
			// No node has it: the pods stay Pending, and no kubelet writes them.
			NodeSelector: map[string]string{"airlock.dev/test-nowhere": "true"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < ready; i++ {
		mk(fmt.Sprintf("ready-%d", i), map[string]string{LabelManagedBy: ManagedBy, LabelPool: "ready", LabelShape: "s1"})
	}
	mk("other-shape", map[string]string{LabelManagedBy: ManagedBy, LabelPool: "ready", LabelShape: "s2"})
	mk("warming", map[string]string{LabelManagedBy: ManagedBy, LabelPool: "warming", LabelShape: "s1"})

	var claimers []*Claimer
	for _, inst := range []string{"a", "b"} {
		l, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "lease-" + inst}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := NewClaimer(ClaimerOptions{Client: cs, Namespace: ns, Shape: "s1", Instance: inst,
			Owner: metav1.OwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Name: l.Name, UID: l.UID}, MaxTimeout: 5 * time.Minute})
		t.Cleanup(c.Stop)
		if err := c.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Ready() != ready {
			t.Fatalf("claimer %s sees %d ready pods, want %d", inst, c.Ready(), ready)
		}
		claimers = append(claimers, c)
	}

	type got struct{ inst, run, pod string }
	var mu sync.Mutex
	var claims []got
	var wg sync.WaitGroup
	for i, c := range claimers {
		inst := []string{"a", "b"}[i]
		for j := 0; j < perClaimer; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run := fmt.Sprintf("run-%s-%d", inst, j)
				if po := c.Claim(ctx, run); po != nil {
					mu.Lock()
					claims = append(claims, got{inst, run, po.Name})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(claims) != ready {
		t.Errorf("%d claims succeeded, want %d (one per ready pod)", len(claims), ready)
	}
	byPod := map[string]got{}
	for _, g := range claims {
		if prev, ok := byPod[g.pod]; ok {
			t.Errorf("pod %s claimed twice: %+v and %+v", g.pod, prev, g)
		}
		byPod[g.pod] = g
	}
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		g, claimed := byPod[p.Name]
		switch {
		case p.Name == "other-shape" || p.Name == "warming":
			if claimed || p.Labels[LabelRun] != "" {
				t.Errorf("pod %s was taken: %v", p.Name, p.Labels)
			}
		case !claimed:
			t.Errorf("pod %s was not claimed: %v", p.Name, p.Labels)
		case p.Labels[LabelPool] != "taken" || p.Labels[LabelRun] != g.run || p.Labels[LabelInstance] != g.inst ||
			len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Name != "lease-"+g.inst:
			t.Errorf("pod %s, claimed by %+v, says labels %v owners %v", p.Name, g, p.Labels, p.OwnerReferences)
		}
	}
	// Once the watch reports them gone, the caches are empty.
	waitFor(t, time.Minute, "caches empty", func() (bool, error) {
		return claimers[0].Ready() == 0 && claimers[1].Ready() == 0, nil
	})
	if po := claimers[0].Claim(ctx, "late"); po != nil {
		t.Errorf("a claim with no ready pod got %s", po.Name)
	}
}
