// Package exchange is the host's side of the driver's framed protocol,
// common to both backends: the frame stream of one sandbox (Stream), one
// run's exchange over it (Run), and a session's file operations (FileOp).
// A backend supplies the streams (containerd's task IO locally, the API
// server's attach on Kubernetes) and how its sandbox is killed and how it
// ended; everything between the work frame and the Result is here, once.
package exchange

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// Frame is one frame from the driver, besides Hello.
type Frame struct {
	T byte
	P []byte
}

// Stream is one sandbox's frame stream: what its driver said, decoded,
// and a writer to its stdin whose frames never interleave.
type Stream struct {
	hello  chan driver.Hello
	frames chan Frame
	gone   chan struct{} // closed when the driver's output ends

	sendMu sync.Mutex
	in     io.Writer
}

// NewStream returns a stream with no input yet (SetInput).
func NewStream() *Stream {
	return &Stream{hello: make(chan driver.Hello, 1), frames: make(chan Frame, 256), gone: make(chan struct{})}
}

// SetInput sets the driver's stdin; call it before Send.
func (s *Stream) SetInput(w io.Writer) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.in = w
}

// Decode reads the driver's frames from r until it ends; onHello, if set,
// is called with each Hello as it arrives (the sandbox is ready, or
// another host attached). Run it in its own goroutine, once.
func (s *Stream) Decode(r io.Reader, onHello func(driver.Hello), log *slog.Logger) {
	defer close(s.gone)
	fr := driver.NewReader(r)
	for {
		t, p, err := fr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				log.Warn("driver stream", "err", err)
			}
			return
		}
		if t == driver.FrameHello {
			var h driver.Hello
			_ = json.Unmarshal(p, &h)
			if onHello != nil {
				onHello(h)
			}
			// A second Hello (the answer to a repeated attach frame) is
			// dropped: the first was taken or is waiting.
			select {
			case s.hello <- h:
			default:
			}
			continue
		}
		s.frames <- Frame{t, p}
	}
}

// Send writes one frame to the driver; frames from concurrent callers (the
// work, an interrupt) never interleave.
func (s *Stream) Send(t byte, payload []byte) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.in == nil {
		return errors.New("driver stream has no input")
	}
	return driver.NewWriter(s.in).Write(t, payload)
}

// Gone is closed when the driver's output has ended.
func (s *Stream) Gone() <-chan struct{} { return s.gone }

// Frames are the driver's frames, besides Hello, in order.
func (s *Stream) Frames() <-chan Frame { return s.frames }

// Hellos delivers the driver's Hello.
func (s *Stream) Hellos() <-chan driver.Hello { return s.hello }

// WaitHello waits for the driver's Hello. diag says, should the stream end
// first, what the sandbox printed.
func (s *Stream) WaitHello(ctx context.Context, diag func() string) (driver.Hello, error) {
	select {
	case h := <-s.hello:
		return h, nil
	case <-s.gone:
		return driver.Hello{}, fmt.Errorf("sandbox ended before its driver was ready: %s", diag())
	case <-ctx.Done():
		return driver.Hello{}, ctx.Err()
	}
}

// Drain hands take the frames already received.
func (s *Stream) Drain(take func(Frame)) {
	for {
		select {
		case f := <-s.frames:
			take(f)
		default:
			return
		}
	}
}

// ErrStreamEnded is wrapped, with runtime.ErrSessionClosed, in FileOp's
// error when the driver's output ended: the sandbox, and so the session,
// is gone.
var ErrStreamEnded = errors.New("the sandbox's driver stream ended")

// FileOpTimeout bounds one file operation in a session.
const FileOpTimeout = 30 * time.Second

// FileOp does one file operation in a session's sandbox and waits, up to
// FileOpTimeout, for the driver's answer. Output left over from an earlier
// call is skipped.
func (s *Stream) FileOp(ctx context.Context, op driver.FileOp) (driver.FileResult, error) {
	payload, err := json.Marshal(op)
	if err != nil {
		return driver.FileResult{}, err
	}
	if err := s.Send(driver.FrameFileOp, payload); err != nil {
		return driver.FileResult{}, runtime.Infra("session file operation", err)
	}
	timer := time.NewTimer(FileOpTimeout)
	defer timer.Stop()
	for {
		select {
		case f := <-s.frames:
			if f.T != driver.FrameFileResult {
				continue // stray output between calls
			}
			var res driver.FileResult
			if err := json.Unmarshal(f.P, &res); err != nil {
				return res, runtime.Infra("session file operation", err)
			}
			return res, nil
		case <-s.gone:
			return driver.FileResult{}, fmt.Errorf("%w: its sandbox stopped (%w)", runtime.ErrSessionClosed, ErrStreamEnded)
		case <-timer.C:
			return driver.FileResult{}, runtime.Infra("session file operation", errors.New("no answer in time"))
		case <-ctx.Done():
			return driver.FileResult{}, ctx.Err()
		}
	}
}
