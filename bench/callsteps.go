package bench

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// callSteps collects the server's "call steps" log lines (JSON, on its
// stderr) by run, as "mcp.<step>": milliseconds since the tool handler
// began.
type callSteps struct {
	mu    sync.Mutex
	seen  *sync.Cond
	buf   []byte
	byRun map[string]map[string]float64
}

func newCallSteps() *callSteps {
	c := &callSteps{byRun: map[string]map[string]float64{}}
	c.seen = sync.NewCond(&c.mu)
	return c
}

// Write takes the server's stderr, a line at a time.
func (c *callSteps) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	for {
		i := bytes.IndexByte(c.buf, '\n')
		if i < 0 {
			break
		}
		line := c.buf[:i]
		c.buf = c.buf[i+1:]
		var m map[string]any
		if json.Unmarshal(line, &m) != nil || m["msg"] != "call steps" {
			continue
		}
		run, _ := m["run"].(string)
		steps := map[string]float64{}
		for k, v := range m {
			if f, ok := v.(float64); ok {
				steps["mcp."+k] = f
			}
		}
		c.byRun[run] = steps
		c.seen.Broadcast()
	}
	if len(c.buf) > 1<<20 {
		c.buf = nil // no line is that long; the rest is not ours
	}
	return len(p), nil
}

// take returns the steps of run, waiting up to d for its line: the
// server writes it before the answer, but stderr is read on its own.
func (c *callSteps) take(run string, d time.Duration) map[string]float64 {
	deadline := time.Now().Add(d)
	stop := time.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.seen.Broadcast()
	})
	defer stop.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if s, ok := c.byRun[run]; ok {
			delete(c.byRun, run)
			return s
		}
		if run == "" || !time.Now().Before(deadline) {
			return nil
		}
		c.seen.Wait()
	}
}
