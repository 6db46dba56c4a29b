package runtime

import (
	"bytes"
	"sync"
)

// TruncationMarker is appended to output that hit its cap, so a reader (or a
// model) sees that something was dropped.
const TruncationMarker = "\n[airlock: output truncated at %d bytes; the rest was dropped]\n"

// cappedBuffer keeps the first max bytes written to it and silently drops the
// rest. Write never fails and never blocks, so a flooding sandbox can neither
// stall its pipe nor grow the server's memory past max.
type cappedBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	max       int
	truncated bool
}

func newCappedBuffer(max int) *cappedBuffer { return &cappedBuffer{max: max} }

// Write implements io.Writer; it reports len(p) so io.Copy keeps draining.
func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.max - c.buf.Len()
	if room >= len(p) {
		c.buf.Write(p)
		return len(p), nil
	}
	if room > 0 {
		c.buf.Write(p[:room])
	}
	c.truncated = true
	return len(p), nil
}

// Result returns the kept bytes and whether anything was dropped.
func (c *cappedBuffer) Result() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.truncated
}
