package tools

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Quotas bound what one client may do, so that one busy or hostile client
// cannot take every sandbox from the others: how many of its runs may be in
// flight, and how many it may start per minute (a token bucket that refills
// continuously, so a client that waits a little gets a little back).
type Quotas struct {
	Concurrent   int
	PerMinute    int
	mu           sync.Mutex
	clients      map[string]*clientQuota
	now          func() time.Time
	lastSweepAge time.Time
}

type clientQuota struct {
	running int
	tokens  float64
	at      time.Time
}

// QuotaError says which per-client limit a call hit and when to retry.
type QuotaError struct{ Msg string }

func (e *QuotaError) Error() string { return e.Msg }

// Take admits one run of client, or says which limit it hit. Release the
// run with the returned function.
func (q *Quotas) Take(client string) (release func(), err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock()
	if q.clients == nil {
		q.clients = map[string]*clientQuota{}
	}
	q.sweepLocked(now)
	c := q.clients[client]
	if c == nil {
		c = &clientQuota{tokens: float64(q.PerMinute), at: now}
		q.clients[client] = c
	}
	// Refill: PerMinute tokens per minute, up to PerMinute.
	c.tokens = math.Min(float64(q.PerMinute), c.tokens+now.Sub(c.at).Minutes()*float64(q.PerMinute))
	c.at = now
	if c.running >= q.Concurrent {
		return nil, &QuotaError{Msg: fmt.Sprintf("This client already has %d runs in flight (limits.per_client_concurrency); wait for one to finish, then retry.", c.running)}
	}
	if c.tokens < 1 {
		wait := time.Duration((1 - c.tokens) / float64(q.PerMinute) * float64(time.Minute))
		return nil, &QuotaError{Msg: fmt.Sprintf("This client started %d runs in the last minute (limits.per_client_runs_per_minute); retry in %.0f s.", q.PerMinute, math.Ceil(wait.Seconds()))}
	}
	c.tokens--
	c.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			c.running--
		})
	}, nil
}

func (q *Quotas) clock() time.Time {
	if q.now != nil {
		return q.now()
	}
	return time.Now()
}

// sweepLocked forgets clients that are idle and full again, so a server
// that saw many clients does not keep them all.
func (q *Quotas) sweepLocked(now time.Time) {
	if now.Sub(q.lastSweepAge) < time.Minute {
		return
	}
	q.lastSweepAge = now
	for id, c := range q.clients {
		if c.running == 0 && now.Sub(c.at) > time.Minute {
			delete(q.clients, id)
		}
	}
}
