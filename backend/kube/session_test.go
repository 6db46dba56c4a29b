package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
