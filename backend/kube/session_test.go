package kube

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/airlock-mcp/airlock/runtime/network/egress"
)

func TestSessionAbandoned(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	slack := 30 * time.Second
	at := func(d time.Duration) string { return stamp(now.Add(d)) }
	cases := []struct {
		name  string
		phase corev1.PodPhase
		ann   map[string]string
		want  bool
	}{
		{"idle deadline ahead", corev1.PodRunning, map[string]string{annIdleUntil: at(time.Minute)}, false},
		{"idle deadline passed, within slack", corev1.PodRunning, map[string]string{annIdleUntil: at(-10 * time.Second)}, false},
		{"idle deadline passed beyond slack", corev1.PodRunning, map[string]string{annIdleUntil: at(-time.Minute)}, true},
		{"idle passed but busy ahead", corev1.PodRunning, map[string]string{annIdleUntil: at(-time.Minute), annBusyUntil: at(time.Minute)}, false},
		{"idle and busy passed", corev1.PodRunning, map[string]string{annIdleUntil: at(-time.Minute), annBusyUntil: at(-time.Minute)}, true},
		{"no record: not airlock's session code", corev1.PodRunning, nil, false},
		{"unreadable record", corev1.PodRunning, map[string]string{annIdleUntil: "yesterday"}, false},
		{"ended at its lifetime", corev1.PodFailed, map[string]string{annIdleUntil: at(time.Hour)}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: c.ann}, Status: corev1.PodStatus{Phase: c.phase}}
			if got := sessionAbandoned(po, now, slack); got != c.want {
				t.Errorf("sessionAbandoned = %v, want %v", got, c.want)
			}
		})
	}
}

// A replica taking a networked session over rebuilds its allow-list from
// the pod: what its own list covers, under its ports; the rest as
// granted.
func TestSessionPolicy(t *testing.T) {
	base, err := egress.ParsePolicy([]string{"api.test", "*.pypi.test"}, []int{443, 8080}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{o: Options{Net: &NetOptions{Policy: base, Addr: netip.MustParseAddrPort("10.1.2.3:3128")}}}
	for _, c := range []struct {
		ann, want, wantErr string
	}{
		{"api.test", "api.test", ""},
		{"api.test,files.pypi.test,granted.example", "api.test,files.pypi.test,granted.example", ""},
		{"", "", ""},
		{"api.test,not a name", "", `"not a name"`},
	} {
		po := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{annEgress: c.ann}}}
		pol, err := m.sessionPolicy(po)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: err %v, want one naming %s", c.ann, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.ann, err)
			continue
		}
		if got := strings.Join(pol.Domains(), ","); got != c.want || !slices.Equal(pol.Ports(), []int{443, 8080}) {
			t.Errorf("%q: domains %q ports %v, want %q and the replica's ports", c.ann, got, pol.Ports(), c.want)
		}
	}
	if _, err := (&Manager{}).sessionPolicy(&corev1.Pod{}); err == nil {
		t.Error("a replica without networked runs took a networked session's policy")
	}
}
