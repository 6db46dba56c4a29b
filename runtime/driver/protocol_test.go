package driver

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	frames := []struct {
		t byte
		p string
	}{{FrameStdout, "hello\n"}, {FrameStderr, ""}, {FrameStdout, "\x00O\x00\x00\x00\x05forge"}, {FrameExit, `{"code":3}`}}
	for _, f := range frames {
		if err := w.Write(f.t, []byte(f.p)); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&b)
	for _, f := range frames {
		typ, p, err := r.Next()
		if err != nil || typ != f.t || string(p) != f.p {
			t.Fatalf("got %q %q %v, want %q %q", typ, p, err, f.t, f.p)
		}
	}
	if _, _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last frame: %v, want EOF", err)
	}
}

func TestFrameBounds(t *testing.T) {
	// A header that claims more than MaxFrame is refused before allocating.
	huge := []byte{FrameStdout, 0xff, 0xff, 0xff, 0xff}
	if _, _, err := NewReader(bytes.NewReader(huge)).Next(); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("huge frame: %v", err)
	}
	// A stream cut inside a frame is not a clean end.
	cut := []byte{FrameStdout, 0, 0, 0, 10, 'a', 'b'}
	if _, _, err := NewReader(bytes.NewReader(cut)).Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut frame: %v", err)
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte{FrameStdout, 0, 0, 0, 1, 'x'})
	f.Add([]byte{FrameExit, 0, 0, 0, 2, '{', '}', FrameStdout})
	f.Add([]byte{0xff, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		for i := 0; i < 1000; i++ {
			_, p, err := r.Next()
			if err != nil {
				return
			}
			if len(p) > MaxFrame {
				t.Fatalf("payload of %d bytes passed the bound", len(p))
			}
		}
	})
}

func TestAnswerAttachEchoesBoundedToken(t *testing.T) {
	h := Hello{Version: 1, Preloaded: true}
	if got := h.AnswerAttach([]byte("abc")); got.Attach != "abc" || !got.Preloaded || got.Version != 1 {
		t.Errorf("AnswerAttach(abc) = %+v", got)
	}
	long := make([]byte, 4*MaxAttachToken)
	for i := range long {
		long[i] = 'x'
	}
	if got := h.AnswerAttach(long); len(got.Attach) != MaxAttachToken {
		t.Errorf("echoed %d bytes of a %d-byte token, want %d", len(got.Attach), len(long), MaxAttachToken)
	}
	if h.Attach != "" {
		t.Error("AnswerAttach changed its receiver")
	}
}
