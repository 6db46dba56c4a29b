package egress

import (
	"bytes"
	"errors"
	"fmt"
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
	fold bool // match ASCII letters case-insensitively (tripwires in host names)
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
	keep    int  // longest needle - 1
	fold    bool // some needle folds case
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
	sc := &scanner{src: src, buf: make([]byte, 32<<10)}
	for _, n := range needles {
		if len(n.find) == 0 {
			continue
		}
		if n.fold {
			n.find = asciiLower(n.find)
			sc.fold = true
		}
		sc.needles = append(sc.needles, n)
		sc.keep = max(sc.keep, len(n.find)-1)
	}
	return sc
}

// Read is io.Reader's. The bytes are the sandbox's (or an upstream's): a
// bug in matching them must fail this one stream, never the server, so a
// panic becomes the stream's error.
func (s *scanner) Read(p []byte) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.in, s.out, s.err = nil, nil, fmt.Errorf("egress: scanning a stream failed: %v", r)
			n, err = 0, s.err
		}
	}()
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
	n = copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *scanner) Close() error { return s.src.Close() }

// process moves what is certainly not (the start of) a needle from in to
// out, applying the needles it finds; at the end of the stream, all of it.
func (s *scanner) process(final bool) {
	var lower []byte // in, ASCII letters folded: the same length, so indexes agree
	if s.fold {
		lower = asciiLower(s.in)
	}
	off := 0
	defer func() { s.in = s.in[off:] }()
	for {
		var low []byte
		if lower != nil {
			low = lower[off:]
		}
		i, n := firstNeedle(s.in[off:], low, s.needles)
		if i < 0 {
			cut := len(s.in)
			if !final {
				cut = max(off, len(s.in)-s.keep)
			}
			s.out = append(s.out, s.in[off:cut]...)
			off = cut
			return
		}
		s.out = append(s.out, s.in[off:off+i]...)
		if !final && off+i+s.keep >= len(s.in) {
			// A longer needle may begin here too: decide once the bytes
			// for the longest have come.
			off += i
			return
		}
		if n.hit != nil {
			n.hit()
		}
		if n.stop {
			off, s.err = len(s.in), errStopped
			return
		}
		s.out = append(s.out, n.repl...)
		off += i + len(n.find)
	}
}

// firstNeedle finds the earliest needle in b (lower is b with ASCII
// letters folded, for folding needles); on a tie, the longest. -1 if none.
func firstNeedle(b, lower []byte, needles []needle) (int, *needle) {
	best, which := -1, (*needle)(nil)
	for k := range needles {
		n := &needles[k]
		hay := b
		if n.fold {
			hay = lower
		}
		i := bytes.Index(hay, n.find)
		if i >= 0 && (best < 0 || i < best || i == best && len(n.find) > len(which.find)) {
			best, which = i, n
		}
	}
	return best, which
}

// asciiLower folds A-Z to a-z and leaves every other byte as it is, so
// that an index into the result is an index into b (bytes.ToLower maps
// invalid UTF-8 to a three-byte rune, and some runes shrink).
func asciiLower(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return out
}

// containsFold reports whether s contains sub, ignoring ASCII case.
func containsFold(s, sub string) bool {
	return bytes.Contains(asciiLower([]byte(s)), asciiLower([]byte(sub)))
}
