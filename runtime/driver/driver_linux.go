package driver

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Paths of the interpreters the driver starts.
const (
	Python = "/usr/bin/python3"
	Bash   = "/bin/bash"
)

// preloadTimeout bounds how long the warm worker may take to import.
const preloadTimeout = 2 * time.Minute

// driver is one run of the in-sandbox program.
type driver struct {
	uid, gid int
	codeDir  string
	out      *lockedWriter
	log      io.Writer
	worker   *worker

	trace   bool
	t0      time.Time
	tmu     sync.Mutex
	timings map[string]float64
}

// lockedWriter serialises frames from the output pumps.
type lockedWriter struct {
	mu sync.Mutex
	w  *Writer
}

func (l *lockedWriter) write(t byte, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(t, p)
}

func (l *lockedWriter) writeJSON(t byte, v any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.WriteJSON(t, v)
}

// Main is the driver program: it parses args, prepares, says hello, runs
// one piece of work and reports how it ended. It returns the process's exit
// status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("airlock-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	uid := fs.Int("uid", 1000, "user the code runs as")
	gid := fs.Int("gid", 1000, "group the code runs as")
	preload := fs.Bool("preload", false, "start a Python worker before the work arrives")
	modules := fs.String("preload-modules", "numpy,pandas", "modules the worker imports, comma-separated")
	codeDir := fs.String("code-dir", CodeDir, "where the code is written")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *uid == 0 || *gid == 0 {
		fmt.Fprintln(stderr, "airlock-driver: refusing to run code as root")
		return 2
	}
	d := &driver{uid: *uid, gid: *gid, codeDir: *codeDir, out: &lockedWriter{w: NewWriter(stdout)}, log: stderr}
	if err := dropBoundingCaps(); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	if err := reserveMainProcess(); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	hello := Hello{Version: Version}
	if *preload {
		var mods []string
		for _, m := range strings.Split(*modules, ",") {
			if m = strings.TrimSpace(m); m != "" {
				mods = append(mods, m)
			}
		}
		w, err := d.startWorker(mods)
		if err != nil {
			hello.PreloadError = err.Error()
		} else {
			d.worker, hello.Preloaded = w, true
		}
	}
	if err := d.out.writeJSON(FrameHello, hello); err != nil {
		return 3
	}
	in := NewReader(stdin)
	t, p, err := in.Next()
	if err != nil || t != FrameWork {
		// The host let this sandbox go before using it.
		d.stopWorker()
		return 0
	}
	var work Work
	if err := json.Unmarshal(p, &work); err != nil {
		_ = d.out.writeJSON(FrameExit, Exit{Code: 127, Error: "bad work frame: " + err.Error()})
		return 0
	}
	d.t0, d.trace = time.Now(), work.Trace
	exit := d.run(work)
	exit.Timings = d.timings
	_ = d.out.writeJSON(FrameExit, exit)
	return 0
}

// mark records a step's time when tracing.
func (d *driver) mark(step string) {
	if !d.trace {
		return
	}
	d.tmu.Lock()
	defer d.tmu.Unlock()
	if d.timings == nil {
		d.timings = map[string]float64{}
	}
	if _, seen := d.timings[step]; !seen {
		d.timings[step] = float64(time.Since(d.t0).Microseconds()) / 1000
	}
}

// dropBoundingCaps empties the capability bounding set, so no process the
// driver starts can ever hold a capability; the driver keeps the two it
// needs (to change user) in its own effective set.
func dropBoundingCaps() error {
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// reserveMainProcess lowers RLIMIT_NPROC by one for everything the driver
// starts. gVisor counts a process against the user that created it, so the
// code's main process, created by the driver as root and then changed to
// the code's user, is not counted; its children are. One less keeps the
// code's processes, main one included, within the limit the spec set.
func reserveMainProcess() error {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &rl); err != nil {
		return fmt.Errorf("read the process limit: %w", err)
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur <= 1 {
		return nil
	}
	rl.Cur--
	if rl.Max != unix.RLIM_INFINITY && rl.Max > rl.Cur {
		rl.Max = rl.Cur
	}
	if err := unix.Setrlimit(unix.RLIMIT_NPROC, &rl); err != nil {
		return fmt.Errorf("set the process limit: %w", err)
	}
	return nil
}

// worker is the preloaded Python interpreter waiting for the go signal.
type worker struct {
	proc   *os.Process
	ctl    *os.File // write end of its fd 3
	stdout *os.File // read ends of its output
	stderr *os.File
	result *os.File // read end of its fd 4: "ready", then the exit report
}

// startWorker starts the warm Python worker and waits until it has
// imported what it preloads.
func (d *driver) startWorker(modules []string) (*worker, error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, errR, errW, err := outputPipes()
	if err != nil {
		return nil, err
	}
	proc, err := d.start(append([]string{Python, "-c", pythonWorker}, modules...), outW, errW, ctlR, resW)
	ctlR.Close()
	resW.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		ctlW.Close()
		resR.Close()
		outR.Close()
		errR.Close()
		return nil, err
	}
	w := &worker{proc: proc, ctl: ctlW, stdout: outR, stderr: errR, result: resR}
	ready := make(chan error, 1)
	go func() {
		// Byte by byte: what follows "ready" is the exit report, read later.
		var line []byte
		b := make([]byte, 1)
		for len(line) < 64 {
			if _, err := resR.Read(b); err != nil {
				ready <- err
				return
			}
			line = append(line, b[0])
			if b[0] == '\n' {
				break
			}
		}
		if string(line) != "ready\n" {
			ready <- fmt.Errorf("worker said %q", line)
			return
		}
		ready <- nil
	}()
	select {
	case err = <-ready:
	case <-time.After(preloadTimeout):
		err = errors.New("worker did not finish its imports in time")
	}
	if err != nil {
		// What the worker printed says why (an import error, say).
		_ = unix.Kill(proc.Pid, unix.SIGKILL)
		_, _ = proc.Wait()
		b, _ := io.ReadAll(io.LimitReader(errR, 4096))
		w.close()
		return nil, fmt.Errorf("preload: %v: %s", err, b)
	}
	return w, nil
}

func (w *worker) close() {
	w.ctl.Close()
	w.stdout.Close()
	w.stderr.Close()
	w.result.Close()
}

func (d *driver) stopWorker() {
	if d.worker == nil {
		return
	}
	// A plain kill(2): gVisor does not deliver os.Process.Kill's
	// pidfd_send_signal.
	_ = unix.Kill(d.worker.proc.Pid, unix.SIGKILL)
	_, _ = d.worker.proc.Wait()
	d.worker.close()
	d.worker = nil
}

// outputPipes makes the pipes the code's stdout and stderr go to.
func outputPipes() (outR, outW, errR, errW *os.File, err error) {
	if outR, outW, err = os.Pipe(); err != nil {
		return
	}
	if errR, errW, err = os.Pipe(); err != nil {
		outR.Close()
		outW.Close()
	}
	return
}

// start starts argv as the code's user, with stdin /dev/null, the given
// stdout and stderr, and extra files as fds 3 and up.
func (d *driver) start(argv []string, stdout, stderr *os.File, extra ...*os.File) (*os.Process, error) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	wd, _ := os.Getwd()
	return os.StartProcess(argv[0], argv, &os.ProcAttr{
		Dir:   wd,
		Env:   os.Environ(),
		Files: append([]*os.File{null, stdout, stderr}, extra...),
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(d.uid), Gid: uint32(d.gid), Groups: []uint32{}},
			Setsid:     true,
		},
	})
}

// run places the work's code and runs it to the end, relaying its output.
func (d *driver) run(work Work) Exit {
	file, argv := "main.py", []string{Python, "-c", PythonBootstrap}
	switch work.Lang {
	case "python":
	case "shell":
		file, argv = "main.sh", []string{Bash, filepath.Join(d.codeDir, "main.sh")}
	default:
		d.stopWorker()
		return Exit{Code: 127, Error: fmt.Sprintf("unknown language %q", work.Lang)}
	}
	if err := d.place(file, work); err != nil {
		d.stopWorker()
		return Exit{Code: 127, Error: err.Error()}
	}
	d.mark("placed")

	var c child
	if work.Lang == "python" && d.worker != nil {
		w := d.worker
		d.worker = nil
		if _, err := w.ctl.Write([]byte("go\n")); err != nil {
			return Exit{Code: 127, Error: "start the code: " + err.Error()}
		}
		w.ctl.Close()
		d.mark("go_sent")
		c = child{proc: w.proc, stdout: w.stdout, stderr: w.stderr, result: w.result}
	} else {
		d.stopWorker()
		var err error
		if c, err = d.startChild(argv, work.Lang == "python"); err != nil {
			return Exit{Code: 127, Error: "start the code: " + err.Error()}
		}
		d.mark("started")
	}
	return d.relay(c)
}

// child is the code's main process and the read ends of its pipes.
type child struct {
	proc           *os.Process
	stdout, stderr *os.File
	// result is where the Python bootstrap reports its exit status before
	// the interpreter is torn down; nil for the shell.
	result *os.File
}

// startChild starts argv as the code with fresh pipes; a Python child also
// gets the exit report pipe as fd 4.
func (d *driver) startChild(argv []string, report bool) (child, error) {
	outR, outW, errR, errW, err := outputPipes()
	if err != nil {
		return child{}, err
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return child{}, err
	}
	// fd 3 is the worker's control pipe; a cold child has none, so fd 3 is
	// /dev/null (the bootstrap closes it) and the result pipe is fd 4 in both.
	null, err := os.Open(os.DevNull)
	if err == nil {
		extra := []*os.File{null, resW}
		if !report {
			extra = nil
		}
		var proc *os.Process
		proc, err = d.start(argv, outW, errW, extra...)
		null.Close()
		if err == nil {
			outW.Close()
			errW.Close()
			resW.Close()
			c := child{proc: proc, stdout: outR, stderr: errR, result: resR}
			if !report {
				resR.Close()
				c.result = nil
			}
			return c, nil
		}
	}
	for _, f := range []*os.File{outR, outW, errR, errW, resR, resW} {
		f.Close()
	}
	return child{}, err
}

// relay frames the child's output until it reports its exit (Python) or
// ends, then reports how it ended. Output is read with one poll loop, so
// that when the exit report arrives everything printed before it is
// already in the pipes and is drained first.
func (d *driver) relay(c child) Exit {
	waitR, waitW, err := os.Pipe()
	if err != nil {
		_ = unix.Kill(c.proc.Pid, unix.SIGKILL)
		return Exit{Code: 127, Error: err.Error()}
	}
	var status syscall.WaitStatus
	var waitErr error
	go func() {
		st, err := c.proc.Wait()
		if err == nil {
			status = st.Sys().(syscall.WaitStatus)
		}
		waitErr = err
		waitW.Write([]byte{1})
		waitW.Close()
	}()
	defer waitR.Close()
	streams := map[int]byte{int(c.stdout.Fd()): FrameStdout, int(c.stderr.Fd()): FrameStderr}
	for fd := range streams {
		_ = unix.SetNonblock(fd, true)
	}
	defer c.stdout.Close()
	defer c.stderr.Close()
	resFd := -1
	if c.result != nil {
		defer c.result.Close()
		resFd = int(c.result.Fd())
	}
	waitFd := int(waitR.Fd())
	buf := make([]byte, 32<<10)
	var report []byte

	// readStream frames what fd has now; false once it reached EOF.
	readStream := func(fd int) bool {
		for {
			n, err := unix.Read(fd, buf)
			if n > 0 {
				d.mark("first_output")
				if d.out.write(streams[fd], buf[:n]) != nil {
					return false
				}
				continue
			}
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return n != 0 && errors.Is(err, unix.EAGAIN)
		}
	}
	drainOpen := func() {
		for fd := range streams {
			if !readStream(fd) {
				delete(streams, fd)
			}
		}
	}
	for {
		pfds := []unix.PollFd{{Fd: int32(waitFd), Events: unix.POLLIN}}
		for fd := range streams {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		if resFd >= 0 {
			pfds = append(pfds, unix.PollFd{Fd: int32(resFd), Events: unix.POLLIN})
		}
		if _, err := unix.Poll(pfds, -1); err != nil && !errors.Is(err, unix.EINTR) {
			_ = unix.Kill(c.proc.Pid, unix.SIGKILL)
			return Exit{Code: 127, Error: "poll: " + err.Error()}
		}
		for _, p := range pfds {
			if p.Revents == 0 {
				continue
			}
			fd := int(p.Fd)
			switch {
			case fd == resFd:
				n, _ := unix.Read(fd, buf)
				if n <= 0 {
					resFd = -1 // the child is gone without a report
					continue
				}
				report = append(report, buf[:n]...)
				if code, ok := parseReport(report); ok {
					// Printed before the report: already in the pipes.
					drainOpen()
					d.mark("reported")
					return Exit{Code: code}
				}
			case fd == waitFd:
				d.mark("exited")
				// The code's main process is gone: so is everything it
				// started, as when a cold sandbox's main process ends.
				// Then its pipes close, and whatever is left in them is read.
				_ = unix.Kill(-1, unix.SIGKILL)
				reapAll()
				for len(streams) > 0 {
					drainOpen()
					if len(streams) > 0 {
						time.Sleep(time.Millisecond)
					}
				}
				d.mark("drained")
				if waitErr != nil {
					return Exit{Code: 127, Error: "wait for the code: " + waitErr.Error()}
				}
				if status.Signaled() {
					return Exit{Code: 128 + int(status.Signal()), Signal: int(status.Signal())}
				}
				return Exit{Code: status.ExitStatus()}
			default:
				if !readStream(fd) {
					delete(streams, fd)
				}
			}
		}
	}
}

// parseReport reads the bootstrap's "exit N" line.
func parseReport(b []byte) (int, bool) {
	line, _, ok := strings.Cut(string(b), "\n")
	if !ok {
		return 0, false
	}
	v, found := strings.CutPrefix(line, "exit ")
	if !found {
		return 0, false
	}
	code, err := strconv.Atoi(v)
	if err != nil || code < 0 || code > 255 {
		return 0, false
	}
	return code, true
}

// place writes the code and its files, root-owned and world-readable.
func (d *driver) place(file string, work Work) error {
	if err := os.MkdirAll(d.codeDir, 0o755); err != nil {
		return fmt.Errorf("code dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(d.codeDir, file), []byte(work.Code), 0o644); err != nil {
		return fmt.Errorf("write code: %w", err)
	}
	for name, data := range work.Files {
		if err := os.WriteFile(filepath.Join(d.codeDir, filepath.Base(name)), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// reapAll collects every exited child (orphans come to init), waiting at
// most a second for ones still dying.
func reapAll() {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.ECHILD) {
			return
		}
		if pid <= 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}
