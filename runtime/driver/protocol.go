// Package driver is the program that runs as init inside every sandbox and
// the framed protocol the runtime speaks with it over the sandbox's stdin and
// stdout.
//
// The driver runs as root inside the sandbox (gVisor's root, with only the
// capabilities to change user), starts the user's code as the unprivileged
// sandbox user, and relays the code's output as frames. The code never holds
// the driver's stdin or stdout, and as another user it can neither trace
// nor signal the driver: whatever it prints arrives as the payload of an
// output frame and cannot forge one.
//
// A frame is one type byte, a big-endian uint32 payload length, and the
// payload. Control payloads are JSON; output payloads are raw bytes.
package driver

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	// FrameHello (driver → host): ready for work; payload Hello.
	FrameHello byte = 'H'
	// FrameWork (host → driver): code to run; payload Work.
	FrameWork byte = 'W'
	// FrameStdout and FrameStderr (driver → host): the code's output, raw.
	FrameStdout byte = 'O'
	FrameStderr byte = 'E'
	// FrameExit (driver → host): the code's main process ended and its
	// output is all sent; payload Exit.
	FrameExit byte = 'X'
	// FrameResult (driver → host): the end of one cell in a session;
	// payload Cell.
	FrameResult byte = 'R'
)

// MaxFrame bounds a frame's payload. The host refuses larger frames, so a
// confused or hostile peer cannot make it allocate without bound.
const MaxFrame = 32 << 20

// ErrFrameTooLarge is returned for a frame whose length exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("driver protocol: frame too large")

// Version is the protocol version the driver announces in Hello.
const Version = 1

// Hello is the driver's first frame.
type Hello struct {
	Version int `json:"version"`
	// Preloaded says a Python worker, its modules imported, is waiting for
	// code.
	Preloaded bool `json:"preloaded"`
	// PreloadError says why a requested preload failed, if it did.
	PreloadError string `json:"preload_error,omitempty"`
}

// Work is one piece of code to run.
type Work struct {
	// Lang is "python" or "shell".
	Lang string `json:"lang"`
	Code string `json:"code"`
	// Files are written next to the code (pip.conf, ca.pem), by base name.
	Files map[string][]byte `json:"files,omitempty"`
	// Trace asks for Exit.Timings, for profiling.
	Trace bool `json:"trace,omitempty"`
}

// Exit is how the code's main process ended.
type Exit struct {
	// Code is the exit status, or 128+signal when killed by a signal.
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// Error is set when the driver could not start the code at all.
	Error string `json:"error,omitempty"`
	// Timings are milliseconds from the work's arrival to each step, when
	// Work.Trace asked for them.
	Timings map[string]float64 `json:"timings,omitempty"`
}

// Writer writes frames. It is not safe for concurrent use; callers
// serialise.
type Writer struct{ w io.Writer }

// NewWriter returns a frame writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes one frame.
func (w *Writer) Write(t byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	var hdr [5]byte
	hdr[0] = t
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.w.Write(payload)
	return err
}

// WriteJSON writes one frame with v encoded as JSON.
func (w *Writer) WriteJSON(t byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.Write(t, b)
}

// Reader reads frames.
type Reader struct{ r *bufio.Reader }

// NewReader returns a frame reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next frame. The payload is a new slice the caller owns.
// A stream that ends between frames returns io.EOF; one that ends inside a
// frame returns io.ErrUnexpectedEOF.
func (r *Reader) Next() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: type %q, %d bytes", ErrFrameTooLarge, hdr[0], n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], p, nil
}
