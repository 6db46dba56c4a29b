package egress

import (
	"bytes"
	"errors"
	"io"
	"net/http"
)

// needle is one byte string a stream is watched for. When found, the
// stream either carries repl in its place or, when stop is set, ends
// with errStopped after hit is called; the needle itself is never passed
// on in either case, because the scanner holds back the last len-1 bytes
// until it knows they do not begin one.
type needle struct {
	find []byte
	fold bool // match ASCII case-insensitively (tripwires in host names)
	repl []byte
	stop bool
	hit  func()
}

// errStopped ends a stream in which a stopping needle was found.
var errStopped = errors.New("egress: stream stopped by the proxy")

// scanner is an io.ReadCloser that rewrites or stops a stream on its
// needles.
type scanner struct {
	src     io.ReadCloser
	needles []needle
	keep    int // longest needle - 1
	in, out []byte
	eof     bool
	err     error
	buf     []byte
}

// newScanner wraps src; with no needles it returns src itself.
func newScanner(src io.ReadCloser, needles []needle) io.ReadCloser {
	if len(needles) == 0 || src == nil || src == http.NoBody {
		return src
	}
	keep := 0
	for _, n := range needles {
		keep = max(keep, len(n.find)-1)
	}
	return &scanner{src: src, needles: needles, keep: keep, buf: make([]byte, 32<<10)}
}

func (s *scanner) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if s.eof {
			s.process(true)
			if len(s.out) == 0 && s.err == nil {
				s.err = io.EOF
			}
			continue
		}
		n, err := s.src.Read(s.buf)
		s.in = append(s.in, s.buf[:n]...)
		switch {
		case errors.Is(err, io.EOF):
			s.eof = true
		case err != nil:
			s.err = err
		}
		s.process(false)
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scanner) Close() error { return s.src.Close() }

// process moves what is certainly not (the start of) a needle from in to
// out, applying the needles it finds; at the end of the stream, all of it.
func (s *scanner) process(final bool) {
	for {
		i, n := firstNeedle(s.in, s.needles)
		if i < 0 {
			cut := len(s.in)
			if !final {
				cut = max(0, len(s.in)-s.keep)
			}
			s.out = append(s.out, s.in[:cut]...)
			s.in = s.in[cut:]
			return
		}
		s.out = append(s.out, s.in[:i]...)
		if n.stop {
			if n.hit != nil {
				n.hit()
			}
			s.in, s.err = nil, errStopped
			return
		}
		if n.hit != nil {
			n.hit()
		}
		s.out = append(s.out, n.repl...)
		s.in = s.in[i+len(n.find):]
	}
}

// firstNeedle finds the earliest needle in b; -1 if none.
func firstNeedle(b []byte, needles []needle) (int, *needle) {
	best, which := -1, (*needle)(nil)
	var lower []byte
	for k := range needles {
		n := &needles[k]
		var i int
		if n.fold {
			if lower == nil {
				lower = bytes.ToLower(b)
			}
			i = bytes.Index(lower, bytes.ToLower(n.find))
		} else {
			i = bytes.Index(b, n.find)
		}
		if i >= 0 && (best < 0 || i < best) {
			best, which = i, n
		}
	}
	return best, which
}

// containsFold reports whether s contains sub, ignoring ASCII case.
func containsFold(s, sub string) bool {
	return bytes.Contains(bytes.ToLower([]byte(s)), bytes.ToLower([]byte(sub)))
}
