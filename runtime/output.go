package runtime

import (
	"bytes"
	"sync"
)

// TruncationMarker is appended to output that hit its cap, so a reader (or a
// model) sees that something was dropped.
const TruncationMarker = "\n[airlock: output truncated at %d bytes; the rest was dropped]\n"

// CappedBuffer keeps the first max bytes written to it and silently drops the
// rest. Write never fails and never blocks, so a flooding sandbox can neither
// stall its pipe nor grow the server's memory past max.
type CappedBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	max       int
	truncated bool
	tap       func([]byte)
}

// NewCappedBuffer keeps max bytes; tap, when set, also sees each kept chunk
// as it arrives (for streaming progress). tap must not block.
func NewCappedBuffer(max int, tap func([]byte)) *CappedBuffer {
	return &CappedBuffer{max: max, tap: tap}
}

// OutputTap adapts a request's output callback to one stream.
func OutputTap(out func(Stream, []byte), s Stream) func([]byte) {
	if out == nil {
		return nil
	}
	return func(p []byte) { out(s, p) }
}

// Write implements io.Writer; it reports len(p) so io.Copy keeps draining.
func (c *CappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.max - c.buf.Len()
	kept := p
	if room < len(p) {
		kept = p[:max(room, 0)]
		c.truncated = true
	}
	c.buf.Write(kept)
	if c.tap != nil && len(kept) > 0 {
		c.tap(kept)
	}
	return len(p), nil
}

// Result returns the kept bytes and whether anything was dropped.
func (c *CappedBuffer) Result() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.truncated
}
