package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// lineLimiter passes a stdio stream of newline-delimited JSON-RPC messages
// through, except a message longer than max bytes: that one is dropped as
// it streams by, never held whole, and answered with a JSON-RPC error (to
// its id when one can be found), and the next message is read as usual.
// Without it, one 100 MB line was read into memory whole, several times
// over, before anything looked at it.
type lineLimiter struct {
	src  io.Reader
	max  int
	out  io.Writer // where the refusal goes; shared with the server's writes
	line []byte    // the message being read, while within max
	over bool      // the current message passed max: dropping to its newline
	skip int64     // bytes of the current message dropped so far
	id   idScanner
	buf  []byte // complete messages ready for Read
	rbuf []byte
	err  error
}

// newLineLimiter bounds each message read from src to max bytes; refusals
// are written to out.
func newLineLimiter(src io.Reader, max int, out io.Writer) *lineLimiter {
	return &lineLimiter{src: src, max: max, out: out, rbuf: make([]byte, 64<<10)}
}

func (l *lineLimiter) Read(p []byte) (int, error) {
	for len(l.buf) == 0 {
		if l.err != nil {
			if len(l.line) > 0 && !l.over {
				// A last message without its newline: pass it on as it is.
				l.buf, l.line = l.line, nil
				break
			}
			return 0, l.err
		}
		n, err := l.src.Read(l.rbuf)
		l.feed(l.rbuf[:n])
		if err != nil {
			l.err = err
		}
	}
	n := copy(p, l.buf)
	l.buf = l.buf[n:]
	return n, nil
}

// feed takes bytes from the source: whole messages within the bound go to
// buf, the bytes of one over it are dropped.
func (l *lineLimiter) feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i+1]
		}
		b = b[len(chunk):]
		if !l.over && len(l.line)+len(chunk) > l.max+1 { // +1: the newline
			l.over, l.skip = true, int64(len(l.line))
			l.id = idScanner{}
			l.id.feed(l.line)
			l.line = nil
		}
		if l.over {
			l.skip += int64(len(chunk))
			l.id.feed(chunk)
			if i >= 0 {
				l.refuse()
				l.over = false
			}
			continue
		}
		l.line = append(l.line, chunk...)
		if i >= 0 {
			l.buf = append(l.buf, l.line...)
			l.line = l.line[:0:0]
		}
	}
}

// refuse answers the dropped message with an Invalid Request error.
func (l *lineLimiter) refuse() {
	id := json.RawMessage("null")
	if l.id.value != nil {
		id = l.id.value
	}
	msg, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error": map[string]any{
			"code": -32600,
			"message": fmt.Sprintf("message of %d bytes refused: a stdio message may hold at most %d bytes (limits.code_bytes and files.max_file_mb set it); nothing of it was processed",
				l.skip, l.max),
		},
	})
	_, _ = l.out.Write(append(msg, '\n'))
}

// idScanner finds the top-level "id" member of a JSON object streaming by,
// in constant memory: it keeps only the key being read (when short) and
// the id's own bytes (a number or a string of at most maxID bytes).
type idScanner struct {
	depth    int
	inString bool
	escaped  bool
	key      []byte // the current top-level key, while short
	keyLong  bool
	inKey    bool
	wantKey  bool // depth 1, before a key
	afterKey bool // depth 1, the key was "id": its value comes next
	capture  []byte
	capping  bool
	value    json.RawMessage
}

// maxID bounds the id value kept; a longer one is left unknown.
const maxID = 256

func (s *idScanner) feed(b []byte) {
	for _, c := range b {
		s.step(c)
	}
}

func (s *idScanner) step(c byte) {
	if s.capping {
		s.captureByte(c)
		return
	}
	if s.inString {
		if s.stringByte(c) {
			s.inString = false
			if s.inKey {
				s.inKey = false
				s.afterKey = !s.keyLong && string(s.key) == "id"
			}
			return
		}
		if s.inKey {
			if len(s.key) < 8 {
				s.key = append(s.key, c)
			} else {
				s.keyLong = true
			}
		}
		return
	}
	switch c {
	case ' ', '\t', '\r', '\n', ':':
		return
	case '{', '[':
		s.depth++
		s.wantKey = s.depth == 1 && c == '{'
		s.afterKey = false
	case '}', ']':
		s.depth--
		s.afterKey = false
	case ',':
		s.wantKey = s.depth == 1
		s.afterKey = false
	case '"':
		s.inString = true
		if s.depth == 1 && s.wantKey {
			s.inKey, s.wantKey, s.key, s.keyLong = true, false, s.key[:0], false
			return
		}
		if s.afterKey && s.value == nil {
			s.capping, s.capture = true, append(s.capture[:0], c)
			s.inString = true
		}
	default:
		if s.afterKey && s.value == nil && (c == '-' || (c >= '0' && c <= '9')) {
			s.capping, s.capture = true, append(s.capture[:0], c)
		}
	}
}

// stringByte steps over c, a byte inside a string, and reports whether it
// ends the string (an unescaped quote).
func (s *idScanner) stringByte(c byte) bool {
	switch {
	case s.escaped:
		s.escaped = false
	case c == '\\':
		s.escaped = true
	case c == '"':
		return true
	}
	return false
}

// captureByte adds c to the id being captured and ends it at its end.
func (s *idScanner) captureByte(c byte) {
	str := s.capture[0] == '"'
	if str {
		s.capture = append(s.capture, c)
		if s.stringByte(c) {
			s.finishCapture()
			s.inString = false
		}
	} else if c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' || (c >= '0' && c <= '9') {
		s.capture = append(s.capture, c)
	} else {
		s.finishCapture()
		s.step(c)
		return
	}
	if len(s.capture) > maxID {
		s.capping, s.capture = false, nil // too long to be an id worth echoing
		s.afterKey = false
		if str {
			s.inString = true // the rest of the string is skipped
		}
	}
}

func (s *idScanner) finishCapture() {
	s.capping, s.afterKey = false, false
	if json.Valid(s.capture) {
		s.value = append(json.RawMessage(nil), s.capture...)
	}
}

// lockedWriter serialises whole writes: the stdio server's responses and
// the limiter's refusals each go out as one Write and never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
