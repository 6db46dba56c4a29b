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
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
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
	// FrameResult (driver → host): what a Python run shows besides its
	// output (a final expression's value, figures, files); payload Rich.
	// It comes just before FrameExit.
	FrameResult byte = 'R'
	// FrameSession (host → driver): keep the interpreter and serve many
	// pieces of work, file operations and interrupts until stdin ends.
	FrameSession byte = 'S'
	// FrameFileOp (host → driver): a file operation in /workspace; payload
	// FileOp. FrameFileResult (driver → host) answers it; payload FileResult.
	FrameFileOp     byte = 'F'
	FrameFileResult byte = 'f'
	// FrameInterrupt (host → driver): stop the work in progress (a
	// session's cell that ran out of time), keeping the session if it can.
	FrameInterrupt byte = 'I'
	// FrameAttach (host → driver): a host has attached to the driver's
	// stdio and asks for Hello. Only a driver started with
	// --hello-on-attach waits for it (on Kubernetes, output written before
	// anyone attached is lost to the attacher); it answers every one that
	// comes while it waits for work, and in a session, so a host may repeat
	// it and another host may take a session over.
	FrameAttach byte = 'A'
	// FrameEgress (host → driver): the egress proxy this driver's relay
	// (--egress-relay) sends to from now on; payload "IP:port". A host
	// that takes a networked session over sends its own.
	FrameEgress byte = 'N'
	// FrameRestored (host → driver), before any work: this sandbox was
	// restored from a checkpoint other sandboxes are restored from too.
	// The warm worker reseeds its random generators (the kernel's entropy
	// is the sandbox's own); with payload "touch" it also touches its
	// memory back in (a pooled sandbox, which waits: not on the first
	// cell's path).
	FrameRestored byte = 'r'
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
	// Attach echoes the attach frame this Hello answers: a host that sees
	// a Hello with a token not its own knows another host has attached.
	Attach string `json:"attach,omitempty"`
}

// MaxAttachToken is the longest attach token echoed back.
const MaxAttachToken = 64

// AnswerAttach is the Hello that answers an attach frame carrying token.
func (h Hello) AnswerAttach(token []byte) Hello {
	if len(token) > MaxAttachToken {
		token = token[:MaxAttachToken]
	}
	h.Attach = string(token)
	return h
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
	// Rich bounds what a Python run may return besides its output.
	Rich RichCaps `json:"rich"`
	// Env are variables for this piece of work only, overlaid on the
	// sandbox's environment (fixed when it booted, before the run was
	// known): a shell run's process gets them; a Python cell's
	// interpreter sets them in os.environ before the cell, and a
	// session's interpreter keeps them afterwards. Names are checked by
	// CheckEnv; the frame is refused otherwise.
	Env map[string]string `json:"env,omitempty"`
	// HomeFiles are written into the code user's home, /workspace, by
	// base name (CheckHomeFile), before the code runs: as the code's user,
	// mode 0600, replacing a file of the same name. Bytes, not strings,
	// so that JSON carries any content intact.
	HomeFiles map[string][]byte `json:"home_files,omitempty"`
}

// RichCaps bound a run's rich results.
type RichCaps struct {
	DisplayBytes    int `json:"display_bytes"`
	MaxImages       int `json:"max_images"`
	ImageBytes      int `json:"image_bytes"`
	MaxFiles        int `json:"max_files"`
	EmbedBytes      int `json:"embed_bytes"`
	EmbedTotalBytes int `json:"embed_total_bytes"`
}

// DefaultRichCaps are the bounds when the host gives none.
var DefaultRichCaps = RichCaps{DisplayBytes: 64 << 10, MaxImages: 4, ImageBytes: 1 << 20, MaxFiles: 100, EmbedBytes: 64 << 10, EmbedTotalBytes: 256 << 10}

// Rich is what a Python run shows besides its output.
type Rich struct {
	// Display is the value of a final expression, as text.
	Display string `json:"display,omitempty"`
	// Images are the matplotlib figures open at the end, as PNG.
	Images        [][]byte `json:"images,omitempty"`
	ImagesSkipped int      `json:"images_skipped,omitempty"`
	FigureError   string   `json:"figure_error,omitempty"`
	// Files are the files under OutDir, with the small ones' content.
	Files          []OutFile `json:"files,omitempty"`
	FilesTruncated bool      `json:"files_truncated,omitempty"`
}

// OutFile is one file the code left under OutDir.
type OutFile struct {
	// Path is relative to /workspace.
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Content []byte `json:"content,omitempty"`
}

// FileOp is a file operation in /workspace, done as the code's user.
type FileOp struct {
	// Op is "write", "read", "list" or "collect".
	Op   string `json:"op"`
	Path string `json:"path"`
	Data []byte `json:"data,omitempty"`
	// MaxBytes bounds a read.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// Since and Caps are for "collect", which lists the regular files
	// under Path modified at or after Since (Unix nanoseconds), with the
	// small ones' content, within Caps.
	Since int64     `json:"since,omitempty"`
	Caps  *RichCaps `json:"caps,omitempty"`
	// Mode, when set, is the permission bits a "write" leaves the file
	// with, whether it was there or not (Work.HomeFiles: 0600). Zero: a
	// new file is 0644, an existing one keeps its own.
	Mode uint32 `json:"mode,omitempty"`
}

// FileResult answers a FileOp.
type FileResult struct {
	Error     string  `json:"error,omitempty"`
	Data      []byte  `json:"data,omitempty"`
	Size      int64   `json:"size,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
	Entries   []Entry `json:"entries,omitempty"`
	// Files answer "collect".
	Files []OutFile `json:"files,omitempty"`
}

// Entry is one directory entry of a list.
type Entry struct {
	Name string `json:"name"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
}

// Exit is how the code's main process ended.
type Exit struct {
	// Code is the exit status, or 128+signal when killed by a signal.
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
	// Error is set when the driver could not start the code at all.
	Error string `json:"error,omitempty"`
	// Timings are milliseconds from the work's arrival to each step, when
	// Work.Trace asked for them, and the arrival itself under ArrivedAt.
	Timings map[string]float64 `json:"timings,omitempty"`
	// Interrupted says the work was stopped by FrameInterrupt.
	Interrupted bool `json:"interrupted,omitempty"`
	// Lost says a session's Python interpreter is gone (it was killed or
	// exited): the session's state with it.
	Lost bool `json:"lost,omitempty"`
	// Limits are limits the driver saw the code hit (LimitDisk).
	Limits []string `json:"limits,omitempty"`
	// MemoryKilled says the code was killed by signal 9 with its memory
	// near the sandbox's limit (gVisor's own kill at the limit).
	MemoryKilled bool `json:"memory_killed,omitempty"`
}

// LimitDisk in Exit.Limits: the code filled /workspace or /tmp.
const LimitDisk = "disk"

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

// pngMagic starts every PNG file.
var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// Clamp holds r to caps and drops what is not what it claims to be: the
// report comes from the interpreter the user's code runs in, so the driver
// and the host each clamp it rather than trust the worker's own bounds.
// It returns nil when nothing is left.
func (r *Rich) Clamp(caps RichCaps) *Rich {
	if r == nil {
		return nil
	}
	if caps == (RichCaps{}) {
		caps = DefaultRichCaps
	}
	if len(r.Display) > caps.DisplayBytes {
		cut := caps.DisplayBytes
		for cut > 0 && !utf8.RuneStart(r.Display[cut]) {
			cut--
		}
		r.Display = r.Display[:cut] + fmt.Sprintf("\n[airlock: display truncated at %d bytes]", caps.DisplayBytes)
	}
	var images [][]byte
	for _, img := range r.Images {
		if len(images) < caps.MaxImages && len(img) <= caps.ImageBytes && bytes.HasPrefix(img, pngMagic) {
			images = append(images, img)
		} else {
			r.ImagesSkipped++
		}
	}
	r.Images = images
	var files []OutFile
	budget := caps.EmbedTotalBytes
	for _, f := range r.Files {
		parts, err := CheckPath(f.Path, false)
		if err != nil || len(parts) < 2 || parts[0] != "out" || f.Size < 0 {
			continue
		}
		if len(files) >= caps.MaxFiles {
			r.FilesTruncated = true
			break
		}
		if len(f.Content) > caps.EmbedBytes || len(f.Content) > budget || int64(len(f.Content)) != f.Size {
			f.Content = nil
		}
		budget -= len(f.Content)
		files = append(files, f)
	}
	r.Files = files
	if len(r.FigureError) > 1024 {
		r.FigureError = r.FigureError[:1024]
	}
	if r.Display == "" && len(r.Images) == 0 && len(r.Files) == 0 && r.ImagesSkipped == 0 && r.FigureError == "" {
		return nil
	}
	return r
}

// ArrivedAt is the Exit.Timings key of the work's arrival at the driver,
// in milliseconds since the Unix epoch: the host puts the driver's steps
// on its own timeline with it (the sandbox's clock is the host's).
const ArrivedAt = "arrived_at"
