package runtime

import (
	"sort"
	"sync"
)

// ReasonPolicyViolation: the sandbox was killed at the first attempt of a
// kind listed in monitor.kill_on.
const ReasonPolicyViolation = "policy_violation"

// Attempt is something the code tried that gVisor's runtime monitoring
// saw and a sandbox's code has no business doing: a mount, a module load,
// a ptrace, a refused privilege change... (monitor.Kind names the kinds).
type Attempt struct {
	Kind    string `json:"kind"`
	Syscall string `json:"syscall"`
	Count   int    `json:"count"`
}

// Attempts counts a sandbox's attempts by kind and syscall until they are
// taken (per run, or per call of a session). It is safe for concurrent use:
// the monitor adds as the code runs.
type Attempts struct {
	mu sync.Mutex
	n  map[[2]string]int
}

// Add counts one attempt.
func (a *Attempts) Add(kind, syscall string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[[2]string]int{}
	}
	a.n[[2]string{kind, syscall}]++
}

// Take returns the attempts counted so far, by kind then syscall, and
// starts counting afresh; nil when there were none.
func (a *Attempts) Take() []Attempt {
	a.mu.Lock()
	n := a.n
	a.n = nil
	a.mu.Unlock()
	if len(n) == 0 {
		return nil
	}
	out := make([]Attempt, 0, len(n))
	for k, c := range n {
		out = append(out, Attempt{Kind: k[0], Syscall: k[1], Count: c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Syscall < out[j].Syscall
	})
	return out
}
