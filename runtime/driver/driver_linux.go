package driver

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Paths of the interpreters the driver starts.
const (
	Python = "/usr/bin/python3"
	Bash   = "/bin/bash"
)

// Bounds of the driver's own waits.
const (
	// preloadTimeout bounds how long the warm worker may take to import.
	preloadTimeout = 2 * time.Minute
	// interruptGrace is how long an interrupted Python cell may take to
	// unwind before its interpreter is killed.
	interruptGrace = 2 * time.Second
	// maxReport bounds one report line from the Python worker.
	maxReport = 24 << 20
)

// driver is one run of the in-sandbox program.
type driver struct {
	uid, gid  int
	codeDir   string
	workspace string
	modules   []string // what a Python worker preloads
	out       *lockedWriter
	log       io.Writer
	worker    *worker
	// gone is a worker that ended with its cell, its pipes closed only
	// after the answer is sent: closing is a system call each, and under
	// gVisor each costs the run's caller up to a few hundred microseconds.
	gone  *worker
	cells int
	hello Hello // what the driver answers an attach frame with
	// egress relays a networked session's connections to its holder's
	// egress proxy (--egress-relay); nil otherwise.
	egress *egressRelay

	// intr is written when the host interrupts the work in progress; the
	// relay polls its read end (intrFd, non-blocking).
	intrR, intrW *os.File
	intrFd       int

	trace   bool
	t0      time.Time
	tmu     sync.Mutex
	timings map[string]float64
}

// lockedWriter serialises frames.
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

// Main is the driver program. It returns the process's exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("airlock-driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	uid := fs.Int("uid", 1000, "user the code runs as")
	gid := fs.Int("gid", 1000, "group the code runs as")
	preload := fs.Bool("preload", false, "start a Python worker before the work arrives")
	modules := fs.String("preload-modules", "numpy,pandas", "modules a preloaded worker imports, comma-separated")
	codeDir := fs.String("code-dir", CodeDir, "where the code is written")
	workspace := fs.String("workspace", Workspace, "the directory file operations are relative to")
	fileop := fs.Bool("fileop", false, "internal: do one file operation read from stdin, as the calling user")
	helloOnAttach := fs.Bool("hello-on-attach", false, "say hello only when the host sends an attach frame (Kubernetes attach)")
	nproc := fs.Int("nproc", 0, "RLIMIT_NPROC for the code's user, when the runtime sets none (Kubernetes); 0: leave it")
	nofile := fs.Int("nofile", 0, "RLIMIT_NOFILE, when the runtime sets none (Kubernetes); 0: leave it")
	readyFile := fs.String("ready-file", "", "create this file once ready for work (preload done): a Kubernetes startup probe checks it")
	fence := fs.Bool("await-fence", false, "before any work, wait until the API server is unreachable: the NetworkPolicy of a networked pod is in force (Kubernetes)")
	egressProxy := fs.String("egress-proxy", "", "the egress proxy (IP:port) of a networked pod: at the first attach, wait until it can be reached before saying hello (Kubernetes)")
	relayListen := fs.String("egress-relay", "", "listen on this IPv4 address:port and relay each connection to the egress proxy, --egress-proxy until FrameEgress names another (a networked session on Kubernetes)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fileop {
		return fileOpMain(*workspace, stdin, stdout)
	}
	if *uid == 0 || *gid == 0 {
		fmt.Fprintln(stderr, "airlock-driver: refusing to run code as root")
		return 2
	}
	if *fence {
		if err := awaitFence(FenceWait); err != nil {
			return failStart(stderr, err)
		}
	}
	d := &driver{uid: *uid, gid: *gid, codeDir: *codeDir, workspace: *workspace, out: &lockedWriter{w: NewWriter(stdout)}, log: stderr}
	// Made now, not on a run's path (the sandbox's is a tmpfs mount).
	if err := os.MkdirAll(d.codeDir, 0o755); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: code dir: %v\n", err)
		return 2
	}
	for _, m := range strings.Split(*modules, ",") {
		if m = strings.TrimSpace(m); m != "" {
			d.modules = append(d.modules, m)
		}
	}
	if err := setLimits(*nproc, *nofile); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	if err := dropBoundingCaps(); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	if err := reserveMainProcess(); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	// Orphans of the code come to the driver, not to whatever is above it:
	// as the sandbox's init it gets them anyway; run elsewhere (its tests)
	// this keeps "every process the call started" within its reach.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: become the subreaper: %v\n", err)
		return 2
	}
	var err error
	if d.intrR, d.intrW, err = os.Pipe(); err != nil {
		fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
		return 2
	}
	d.intrFd = int(d.intrR.Fd())
	_ = unix.SetNonblock(d.intrFd, true)
	if *relayListen != "" {
		if d.egress, err = startRelay(*relayListen, *egressProxy); err != nil {
			return failStart(stderr, err)
		}
	}
	hello := Hello{Version: Version}
	if *preload {
		if w, err := d.startWorker(d.modules); err != nil {
			hello.PreloadError = err.Error()
		} else if err := w.waitReady(preloadTimeout); err != nil {
			w.kill()
			hello.PreloadError = err.Error()
		} else {
			d.worker, hello.Preloaded = w, true
		}
	}
	d.hello = hello
	if *readyFile != "" {
		// Root's, in the driver's own directory; the code may see it, and
		// it says nothing the code does not know.
		if err := os.WriteFile(*readyFile, nil, 0o644); err != nil {
			fmt.Fprintf(stderr, "airlock-driver: %v\n", err)
			return 2
		}
	}
	in := NewReader(stdin)
	if !*helloOnAttach {
		if err := d.out.writeJSON(FrameHello, hello); err != nil {
			return 3
		}
	}
	t, p, err := in.Next()
	if err == nil && t == FrameAttach && *egressProxy != "" {
		// The host has registered this pod with its proxy before it
		// attached; an enforcer may program the rule that lets the pod
		// reach the proxy a moment after the one that fences it.
		if err := awaitProxy(*egressProxy, FenceWait); err != nil {
			return failStart(stderr, err)
		}
	}
	for err == nil && (t == FrameAttach || t == FrameEgress || t == FrameRestored) {
		switch t {
		case FrameEgress:
			d.setEgress(p)
		case FrameRestored:
			// The worker's next command comes after this one in its pipe.
			if d.worker != nil {
				cmd, _ := json.Marshal(map[string]bool{"restored": true, "touch": string(p) == "touch"})
				if _, werr := d.worker.ctl.Write(append(cmd, '\n')); werr != nil {
					fmt.Fprintf(stderr, "airlock-driver: tell the worker it was restored: %v\n", werr)
				}
			}
		default:
			if err := d.out.writeJSON(FrameHello, hello.AnswerAttach(p)); err != nil {
				return 3
			}
		}
		t, p, err = in.Next()
	}
	switch {
	case err != nil:
		// The host let this sandbox go before using it.
		d.stopWorker()
		return 0
	case t == FrameSession:
		d.session(in)
		return 0
	case t != FrameWork:
		return 0
	}
	var work Work
	if err := json.Unmarshal(p, &work); err != nil {
		_ = d.out.writeJSON(FrameExit, Exit{Code: 127, Error: "bad work frame: " + err.Error()})
		return 0
	}
	d.t0, d.trace = time.Now(), work.Trace
	rich, exit := d.runWork(work, false)
	if rich != nil {
		_ = d.out.writeJSON(FrameResult, rich)
	}
	_ = d.out.writeJSON(FrameExit, exit)
	d.closeGone()
	return 0
}

// closeGone closes the pipes of a worker that ended with its cell.
func (d *driver) closeGone() {
	if w := d.gone; w != nil {
		d.gone = nil
		w.closePipes()
	}
}

// runWork runs one piece of work and notes, besides its exit, the limits
// it was seen to hit from in here: a writable filesystem it filled.
func (d *driver) runWork(w Work, session bool) (*Rich, Exit) {
	// A session's workspace may be full from an earlier call; a fresh
	// sandbox's is not.
	fullBefore := session && diskFull()
	rich, exit := d.run(w, session)
	if !fullBefore && diskFull() {
		exit.Limits = append(exit.Limits, LimitDisk)
	}
	d.mark("answered")
	if d.timings != nil {
		d.timings[ArrivedAt] = float64(d.t0.UnixMicro()) / 1000
	}
	exit.Timings = d.timings
	return rich, exit
}

// diskFull reports whether /workspace or /tmp, both size-capped, has no
// room left. A file filled and deleted again before the code ended is not
// seen; this is a count for metrics, not an enforcement (the cap is).
func diskFull() bool {
	for _, dir := range []string{Workspace, "/tmp"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Blocks > 0 && st.Bavail == 0 {
			return true
		}
	}
	return false
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
// driver starts can ever hold a capability; the driver keeps the ones it
// needs in its own effective set.
//
// The bounding set belongs to a thread, and a child inherits the set of
// whichever thread forked it: the drop is made on every thread of the
// process (AllThreadsSyscall), not only the one running this function.
// Done on one thread, about one run in fifteen started its code from
// another and kept CAP_KILL, CAP_SETGID, CAP_SETUID and CAP_SETPCAP there.
func dropBoundingCaps() error {
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		_, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if errno != 0 && errno != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, errno)
		}
	}
	return nil
}

// setLimits sets the process and open-file limits the runtime left unset:
// containerd's OCI spec sets them locally; a pod spec cannot, so on
// Kubernetes the driver does, before it drops its capabilities (lowering a
// limit needs none, but the order keeps every process after it bound).
// Core dumps are always off.
func setLimits(nproc, nofile int) error {
	set := func(res int, name string, n uint64) error {
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return fmt.Errorf("set %s to %d: %w", name, n, err)
		}
		return nil
	}
	if err := set(unix.RLIMIT_CORE, "RLIMIT_CORE", 0); err != nil {
		return err
	}
	if nproc > 0 {
		if err := set(unix.RLIMIT_NPROC, "RLIMIT_NPROC", uint64(nproc)); err != nil {
			return err
		}
	}
	if nofile > 0 {
		if err := set(unix.RLIMIT_NOFILE, "RLIMIT_NOFILE", uint64(nofile)); err != nil {
			return err
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

// child is a process the code runs in, with the read ends of its pipes
// and a pipe that becomes readable when it exits.
type child struct {
	pid            int
	stdout, stderr *os.File
	waitR          *os.File
	// Raw descriptors, taken once: os.File.Fd puts a descriptor back into
	// blocking mode every time it is called.
	outFd, errFd, waitFd int
	mu                   sync.Mutex
	status               syscall.WaitStatus
	waitErr              error
	// maxRSS is the peak resident memory, in KiB, of the child and the
	// descendants it waited for.
	maxRSS int64
}

// startChild starts argv as the code's user with fresh output pipes,
// stdin /dev/null and extra files as fds 3 and up; its own process group.
// Its environment is the driver's (the sandbox's) overlaid with env. Its
// output pipes are non-blocking, for the relay's poll loop.
func (d *driver) startChild(argv []string, env map[string]string, extra ...*os.File) (*child, error) {
	wd, _ := os.Getwd()
	c, err := d.spawn(argv, spawnOpts{dir: wd, env: overlayEnv(os.Environ(), env), setsid: true, extra: extra})
	if err != nil {
		return nil, err
	}
	for _, fd := range []int{c.outFd, c.errFd} {
		_ = unix.SetNonblock(fd, true)
	}
	return c, nil
}

// spawnOpts say how spawn starts a child besides its argv.
type spawnOpts struct {
	stdin  *os.File // nil: /dev/null
	dir    string
	env    []string
	setsid bool
	extra  []*os.File // fds 3 and up
}

// spawn starts argv as the code's user with fresh output pipes and a wait
// pipe that becomes readable when it exits.
func (d *driver) spawn(argv []string, o spawnOpts) (*child, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	stdin := o.stdin
	if stdin == nil {
		if stdin, err = os.Open(os.DevNull); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, err
		}
		defer stdin.Close()
	}
	proc, err := os.StartProcess(argv[0], argv, &os.ProcAttr{
		Dir:   o.dir,
		Env:   o.env,
		Files: append([]*os.File{stdin, outW, errW}, o.extra...),
		Sys: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(d.uid), Gid: uint32(d.gid), Groups: []uint32{}},
			Setsid:     o.setsid,
		},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	waitR, waitW, err := os.Pipe()
	if err != nil {
		_ = unix.Kill(proc.Pid, unix.SIGKILL)
		return nil, err
	}
	c := &child{pid: proc.Pid, stdout: outR, stderr: errR, waitR: waitR,
		outFd: int(outR.Fd()), errFd: int(errR.Fd()), waitFd: int(waitR.Fd())}
	go func() {
		st, err := proc.Wait()
		c.mu.Lock()
		if err == nil {
			c.status = st.Sys().(syscall.WaitStatus)
			if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
				c.maxRSS = ru.Maxrss
			}
		}
		c.waitErr = err
		c.mu.Unlock()
		waitW.Write([]byte{1})
		waitW.Close()
	}()
	return c, nil
}

// exit is how the child ended, once its wait pipe is readable.
func (c *child) exit() Exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waitErr != nil {
		return Exit{Code: 127, Error: "wait for the code: " + c.waitErr.Error()}
	}
	e := Exit{Code: c.status.ExitStatus()}
	if c.status.Signaled() {
		e = Exit{Code: 128 + int(c.status.Signal()), Signal: int(c.status.Signal())}
	}
	e.MemoryKilled = memoryKilled(e.Code, c.maxRSS, memTotalKiB())
	return e
}

// memoryKilled reports whether an exit looks like the memory limit's: a
// kill by signal 9 (or a shell's 137 for its child's) after the code's
// processes peaked within a quarter of the sandbox's memory. gVisor kills
// a task at the limit itself, so no host OOM event says so on Kubernetes;
// locally the memory cgroup does too. Code that kills itself with signal 9
// after filling its memory is counted as out of memory: it only labels
// its own run.
func memoryKilled(code int, maxRSSKiB, memTotalKiB int64) bool {
	return code == 128+int(unix.SIGKILL) && memTotalKiB > 0 && maxRSSKiB*4 >= memTotalKiB*3
}

// memTotalKiB is MemTotal from /proc/meminfo: inside gVisor, the sandbox's
// memory limit. 0 when unknown.
func memTotalKiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func (c *child) close() {
	c.stdout.Close()
	c.stderr.Close()
	c.waitR.Close()
}

// worker is a Python interpreter running pythonWorker: its control pipe
// (fd 3) and report pipe (fd 4).
type worker struct {
	*child
	ctl    *os.File
	report *lineReader
	ready  bool
}

// startWorker starts a Python worker that imports modules.
func (d *driver) startWorker(modules []string) (*worker, error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	// The sandbox's environment only: a worker may be started before the
	// run it serves is known; each cell brings its own (Work.Env).
	c, err := d.startChild(append([]string{Python, "-c", pythonWorker}, modules...), nil, ctlR, repW)
	ctlR.Close()
	repW.Close()
	if err != nil {
		ctlW.Close()
		repR.Close()
		return nil, err
	}
	rep := &lineReader{f: repR, fd: int(repR.Fd())}
	_ = unix.SetNonblock(rep.fd, true)
	return &worker{child: c, ctl: ctlW, report: rep}, nil
}

// waitReady waits for the worker's "ready" line.
func (w *worker) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !w.ready {
		line, ok, err := w.report.next()
		switch {
		case err != nil:
			b, _ := io.ReadAll(io.LimitReader(w.stderr, 4096))
			return fmt.Errorf("preload: the worker ended: %s", b)
		case ok && string(line) == "ready":
			w.ready = true
		case ok:
			return fmt.Errorf("preload: the worker said %q", line)
		case time.Now().After(deadline):
			return errors.New("preload: the worker did not finish its imports in time")
		default:
			pollIn([]int{w.report.fd, w.waitFd}, 100*time.Millisecond)
		}
	}
	return nil
}

func (w *worker) kill() {
	_ = unix.Kill(w.pid, unix.SIGKILL)
	pollIn([]int{w.waitFd}, time.Second)
	w.closePipes()
}

// closePipes closes the worker's control and report pipes and its child's.
func (w *worker) closePipes() {
	w.ctl.Close()
	w.report.f.Close()
	w.close()
}

// stopWorker ends the preloaded worker, if any (a shell run needs none).
func (d *driver) stopWorker() {
	if d.worker != nil {
		d.worker.kill()
		d.worker = nil
	}
}

// lineReader reads newline-terminated lines from a non-blocking fd.
type lineReader struct {
	f   *os.File
	fd  int
	buf []byte
	eof bool
}

// next returns a whole line when one is there, ok=false when not yet, and
// an error at EOF or when a line grows past maxReport.
func (l *lineReader) next() ([]byte, bool, error) {
	for {
		if i := indexByte(l.buf, '\n'); i >= 0 {
			line := l.buf[:i]
			l.buf = l.buf[i+1:]
			return line, true, nil
		}
		if l.eof {
			return nil, false, io.EOF
		}
		if len(l.buf) > maxReport {
			return nil, false, errors.New("report line too long")
		}
		chunk := make([]byte, 64<<10)
		n, err := unix.Read(l.fd, chunk)
		if n > 0 {
			l.buf = append(l.buf, chunk[:n]...)
			continue
		}
		switch {
		case err == nil:
			l.eof = true
		case errors.Is(err, unix.EAGAIN):
			return nil, false, nil
		case errors.Is(err, unix.EINTR):
		default:
			return nil, false, err
		}
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// pollIn waits up to d for any of fds to be readable.
func pollIn(fds []int, d time.Duration) {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	_, _ = unix.Poll(pfds, int(d.Milliseconds()))
}

// run places a piece of work and runs it: a Python cell in the worker, or
// a shell script in a new bash. In a session the worker stays for the next
// cell; otherwise everything the code started is killed when it ends, as
// when a cold sandbox's main process ends.
func (d *driver) run(work Work, session bool) (*Rich, Exit) {
	d.cells++
	var file string
	switch work.Lang {
	case "python":
		file = "main.py"
	case "shell":
		file = "main.sh"
	default:
		return nil, Exit{Code: 127, Error: fmt.Sprintf("unknown language %q", work.Lang)}
	}
	// The host checks these too; the driver does not rely on it.
	if err := CheckEnv(work.Env); err != nil {
		return nil, Exit{Code: 127, Error: "bad work frame: " + err.Error()}
	}
	if err := checkHomeFiles(work.HomeFiles); err != nil {
		return nil, Exit{Code: 127, Error: "bad work frame: " + err.Error()}
	}
	if session {
		file = fmt.Sprintf("cell-%d%s", d.cells, filepath.Ext(file))
	}
	path := filepath.Join(d.codeDir, file)
	// Files under OutDir changed from here on are the run's.
	since := fileClock()
	if work.Rich == (RichCaps{}) {
		work.Rich = DefaultRichCaps
	}
	if err := d.place(file, work); err != nil {
		return nil, Exit{Code: 127, Error: err.Error()}
	}
	d.mark("placed")
	if len(work.HomeFiles) > 0 {
		if err := d.writeHomeFiles(work.HomeFiles); err != nil {
			return nil, Exit{Code: 127, Error: err.Error()}
		}
		d.mark("home_files")
	}
	if work.Lang == "shell" {
		if !session {
			d.stopWorker() // its memory and processes are the script's now
		}
		c, err := d.startChild([]string{Bash, path}, work.Env)
		if err != nil {
			return nil, Exit{Code: 127, Error: "start the code: " + err.Error()}
		}
		defer c.close()
		d.mark("started")
		exit := d.relay(c, nil, session).Exit
		return d.collect(nil, since, work.Rich).Clamp(work.Rich), exit
	}
	if d.worker == nil {
		modules := []string(nil)
		if session {
			modules = d.modules // a session lives long: give it what a warm one has
		}
		w, err := d.startWorker(modules)
		if err != nil {
			return nil, Exit{Code: 127, Error: "start the code: " + err.Error()}
		}
		d.worker = w
		d.mark("started")
	}
	mode := "once"
	if session {
		mode = "session"
	}
	cell := map[string]any{"path": path, "mode": mode, "caps": work.Rich}
	if len(work.Env) > 0 {
		cell["env"] = work.Env // the worker sets it in os.environ before the cell
	}
	cmd, _ := json.Marshal(cell)
	if _, err := d.worker.ctl.Write(append(cmd, '\n')); err != nil {
		d.stopWorker()
		return nil, Exit{Code: 127, Error: "start the code: " + err.Error(), Lost: session}
	}
	d.mark("go_sent")
	w := d.worker
	exit := d.relay(w.child, w, session)
	if exit.rich == nil && (exit.Lost || !session) {
		// The interpreter is gone without a report.
		d.worker, d.gone = nil, w
	}
	rich := exit.rich
	if !exit.Lost {
		rich = d.collect(rich, since, work.Rich)
	}
	return rich.Clamp(work.Rich), exit.Exit
}

// fileClock is now as file timestamps tell it. Linux stamps files from
// the coarse clock, which lags the precise one by up to a tick: compared
// with time.Now, a file written a moment later could seem older. (Now
// less the clock's resolution is not enough: a test's file, written a
// moment later, came out older than that.)
func fileClock() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts); err != nil {
		return time.Now().Add(-20 * time.Millisecond).UnixNano()
	}
	return ts.Nano()
}

// collect adds to r the files under OutDir modified since the run began,
// read by the file helper as the code's user. Most runs leave no OutDir,
// and pay only for one lstat.
func (d *driver) collect(r *Rich, since int64, caps RichCaps) *Rich {
	if st, err := os.Lstat(filepath.Join(d.workspace, "out")); err != nil || !st.IsDir() {
		return r
	}
	payload, _ := json.Marshal(FileOp{Op: "collect", Path: "out", Since: since, Caps: &caps})
	res := d.fileOp(payload)
	d.mark("collected")
	if len(res.Files) == 0 && !res.Truncated {
		return r
	}
	if r == nil {
		r = &Rich{}
	}
	r.Files, r.FilesTruncated = res.Files, res.Truncated
	return r
}

// relayed is how a piece of work ended.
type relayed struct {
	Exit
	rich *Rich
}

// relay frames the child's output until the work ends: the worker reports
// the cell (Python), or the child exits. One poll loop reads everything,
// so when the report arrives whatever was printed before it is already in
// the pipes and is read first. An interrupt from the host stops the work.
func (d *driver) relay(c *child, w *worker, session bool) relayed {
	streams := map[int]byte{c.outFd: FrameStdout, c.errFd: FrameStderr}
	buf := make([]byte, 32<<10)
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
	drain := func() {
		for fd := range streams {
			if !readStream(fd) {
				delete(streams, fd)
			}
		}
	}
	waitFd, intrFd := c.waitFd, d.intrFd
	var interrupted time.Time
	// fromReport ends the cell at the worker's report, if it has come:
	// whatever was printed before it is read first.
	fromReport := func() (relayed, bool) {
		if w == nil {
			return relayed{}, false
		}
		line, ok := w.reportLine()
		if !ok {
			return relayed{}, false
		}
		drain()
		d.mark("reported")
		return d.reported(line, !interrupted.IsZero()), true
	}
	for {
		pfds := []unix.PollFd{{Fd: int32(waitFd), Events: unix.POLLIN}, {Fd: int32(intrFd), Events: unix.POLLIN}}
		for fd := range streams {
			pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
		if w != nil {
			pfds = append(pfds, unix.PollFd{Fd: int32(w.report.fd), Events: unix.POLLIN})
		}
		timeout := -1
		if !interrupted.IsZero() {
			timeout = int(max(time.Until(interrupted.Add(interruptGrace)), 0).Milliseconds())
		}
		n, err := unix.Poll(pfds, timeout)
		if err != nil && !errors.Is(err, unix.EINTR) {
			_ = unix.Kill(c.pid, unix.SIGKILL)
			return relayed{Exit: Exit{Code: 127, Error: "poll: " + err.Error(), Lost: session}}
		}
		if n == 0 && !interrupted.IsZero() {
			// The cell did not unwind in time: kill the interpreter.
			_ = unix.Kill(c.pid, unix.SIGKILL)
			interrupted = time.Now().Add(time.Hour)
			continue
		}
		for _, p := range pfds {
			if p.Revents == 0 {
				continue
			}
			fd := int(p.Fd)
			switch {
			case fd == intrFd:
				var b [16]byte
				_, _ = unix.Read(intrFd, b[:])
				if interrupted.IsZero() {
					interrupted = time.Now()
					if w != nil {
						_ = unix.Kill(c.pid, unix.SIGINT) // KeyboardInterrupt in the cell
					} else {
						_ = unix.Kill(-c.pid, unix.SIGKILL) // the script's whole group
					}
				}
			case w != nil && fd == w.report.fd:
				if r, ok := fromReport(); ok {
					return r
				}
			case fd == waitFd:
				// A "once" worker exits right after its report: both may
				// be ready in one poll, and the report is the cell's end
				// (its display and figures), not the exit.
				if r, ok := fromReport(); ok {
					return r
				}
				d.mark("exited")
				if session {
					// What the script left running, wherever it went: it
					// may hold the output pipes open, and would outlive
					// the call.
					d.endCall()
				} else {
					killAll(c.pid)
				}
				reapExited()
				for len(streams) > 0 {
					drain()
					if len(streams) > 0 {
						time.Sleep(time.Millisecond)
					}
				}
				d.mark("drained")
				exit := c.exit()
				exit.Interrupted = !interrupted.IsZero()
				exit.Lost = session && w != nil
				return relayed{Exit: exit}
			default:
				if !readStream(fd) {
					delete(streams, fd)
				}
			}
		}
	}
}

// reportLine is the worker's next whole report line, if one has come
// (poll does not see what is already buffered); a cold worker's first
// word, "ready", is not one.
func (w *worker) reportLine() ([]byte, bool) {
	for {
		line, ok, err := w.report.next()
		if err != nil || !ok {
			return nil, false // at EOF the exit shows on the wait pipe
		}
		if !w.ready && string(line) == "ready" {
			w.ready = true
			continue
		}
		return line, true
	}
}

// reported turns the worker's report line into the cell's end.
func (d *driver) reported(line []byte, interrupted bool) relayed {
	var rep struct {
		Exit           int       `json:"exit"`
		Display        string    `json:"display"`
		Images         []string  `json:"images"`
		ImagesSkipped  int       `json:"images_skipped"`
		FigureError    string    `json:"figure_error"`
		Files          []OutFile `json:"files"`
		FilesTruncated bool      `json:"files_truncated"`
		Interrupted    bool      `json:"interrupted"`
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return relayed{Exit: Exit{Code: 127, Error: "unreadable report from the Python worker"}}
	}
	r := &Rich{Display: rep.Display, ImagesSkipped: rep.ImagesSkipped, FigureError: rep.FigureError, Files: rep.Files, FilesTruncated: rep.FilesTruncated}
	for _, s := range rep.Images {
		if b, err := decodeB64(s); err == nil {
			r.Images = append(r.Images, b)
		}
	}
	exit := Exit{Code: rep.Exit, Interrupted: interrupted || rep.Interrupted}
	if r.Display == "" && len(r.Images) == 0 && len(r.Files) == 0 && r.ImagesSkipped == 0 && r.FigureError == "" {
		r = nil
	}
	return relayed{Exit: exit, rich: r}
}

// place writes the code and its files, root-owned and world-readable.
func (d *driver) place(file string, work Work) error {
	if err := writeSmallFile(filepath.Join(d.codeDir, file), []byte(work.Code)); err != nil {
		return fmt.Errorf("write code: %w", err)
	}
	for name, data := range work.Files {
		if err := writeSmallFile(filepath.Join(d.codeDir, filepath.Base(name)), data); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// writeHomeFiles writes files into the code user's home, /workspace, mode
// 0600, through the file helper: as the code's user, so that the files are
// the code's own and a link or FIFO the code left under a name (a
// session's /workspace is the code's) cannot make the driver, root, write
// anywhere else. Names were checked (CheckHomeFile).
func (d *driver) writeHomeFiles(files map[string][]byte) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		payload, err := json.Marshal(FileOp{Op: "write", Path: name, Data: files[name], Mode: 0o600})
		if err != nil {
			return fmt.Errorf("home file %s: %w", name, err)
		}
		if res := d.fileOp(payload); res.Error != "" {
			return fmt.Errorf("write home file %s: %s", name, res.Error)
		}
	}
	return nil
}

// writeSmallFile writes a file on a tmpfs, mode 0644, with raw system
// calls: each is short, and os.WriteFile's extra fstat and its hand-offs
// to the Go scheduler cost a warm run under gVisor about 0.4 ms (writing
// print(1)'s file: 1.3 ms that way, 0.9 ms this way, p50 of 60 runs).
func writeSmallFile(path string, data []byte) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	cwd := unix.AT_FDCWD // the path is absolute; a variable, as a negative constant is no uintptr
	fd, _, errno := unix.RawSyscall6(unix.SYS_OPENAT, uintptr(cwd), uintptr(unsafe.Pointer(p)),
		uintptr(unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC), 0o644, 0, 0)
	if errno != 0 {
		return &os.PathError{Op: "open", Path: path, Err: errno}
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	for len(data) > 0 {
		n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)))
		switch {
		case errno == unix.EINTR:
			continue
		case errno != 0:
			return &os.PathError{Op: "write", Path: path, Err: errno}
		}
		data = data[n:]
	}
	return nil
}

// killAll kills what the code left running when its main process ended.
// As the sandbox's init, the driver kills every other process (kill -1);
// run elsewhere (its tests), only the code's process group.
func killAll(pid int) {
	if os.Getpid() == 1 {
		_ = unix.Kill(-1, unix.SIGKILL)
		return
	}
	_ = unix.Kill(-pid, unix.SIGKILL)
}

// endCall kills every process a session's call left, however it got
// away (setsid, a double fork, a new process group, SIGTERM ignored), and
// keeps only the driver and the session's Python interpreter, whose own
// children go too. Killed processes cannot fork, so a few rounds catch
// what was forked between a scan and its kill; RLIMIT_NPROC bounds how
// many there can be.
//
// A scan that finds nothing alive is the end only if it found no process
// that died since the last one: /proc is listed, then each entry read, so
// a parent that forks and exits between the two is read as a zombie while
// its child, born after the listing, is not seen at all (a double fork
// did exactly that under load, and its orphan held the output pipes open
// for good). A zombie has given its children away before it became one,
// so a listing taken after it was seen has them.
func (d *driver) endCall() {
	self := os.Getpid()
	keep := map[int]bool{self: true}
	if d.worker != nil {
		keep[d.worker.pid] = true
	}
	seenDead := map[int]bool{}
	for round := 0; round < 100; round++ {
		left, dead := descendants(self, keep)
		newlyDead := false
		for _, pid := range dead {
			if !seenDead[pid] {
				seenDead[pid], newlyDead = true, true
			}
		}
		if len(left) == 0 && !newlyDead {
			break
		}
		for _, pid := range left {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		reapExited()
		if round > 0 {
			time.Sleep(time.Millisecond)
		}
	}
	// The interpreter's killed children stay zombies until it waits for
	// them: it does at the start of its next cell (bootstrap.go).
}

// descendants lists the processes below root (a subreaper, so every
// orphan of its tree is its child): the live ones, skipping the members
// of keep but not their children, and the zombies, which are already dead.
func descendants(root int, keep map[int]bool) (live, zombies []int) {
	type proc struct {
		pid    int
		zombie bool
	}
	children := map[int][]proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], proc{pid, state == 'Z' || state == 'X'})
	}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			switch {
			case c.zombie:
				zombies = append(zombies, c.pid)
			case keep[c.pid]:
				queue = append(queue, c.pid)
			default:
				queue = append(queue, c.pid)
				live = append(live, c.pid)
			}
		}
	}
	return live, zombies
}

// procStat reads a process's parent and state from /proc/PID/stat. The
// command name may hold spaces and parentheses: fields start after the
// last ')'.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+4 >= len(b) {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}

// reapExited collects every exited child (orphans come to init), waiting
// at most a second for ones still dying.
func reapExited() {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.ECHILD) {
			return
		}
		if pid <= 0 {
			return
		}
	}
}

// setEgress points the relay at the proxy a host named. Without a relay,
// or with a payload that is no address, nothing changes: the host's next
// call then fails to reach the network, and says so.
func (d *driver) setEgress(p []byte) {
	if d.egress == nil {
		fmt.Fprintln(d.log, "airlock-driver: an egress address for a sandbox without a relay; ignored")
		return
	}
	if err := d.egress.setUpstream(string(p)); err != nil {
		fmt.Fprintf(d.log, "airlock-driver: %v\n", err)
	}
}

// session serves work, file operations and interrupts until stdin ends.
func (d *driver) session(in *Reader) {
	type msg struct {
		t byte
		p []byte
	}
	work := make(chan msg, 16)
	go func() {
		defer close(work)
		for {
			t, p, err := in.Next()
			if err != nil {
				return
			}
			if t == FrameInterrupt {
				_, _ = d.intrW.Write([]byte{1})
				continue
			}
			work <- msg{t, p}
		}
	}()
	for m := range work {
		// An interrupt that came after its cell ended must not hit the next.
		for {
			var b [16]byte
			if n, _ := unix.Read(d.intrFd, b[:]); n <= 0 {
				break
			}
		}
		switch m.t {
		case FrameWork:
			var w Work
			if err := json.Unmarshal(m.p, &w); err != nil {
				_ = d.out.writeJSON(FrameExit, Exit{Code: 127, Error: "bad work frame: " + err.Error()})
				continue
			}
			d.t0, d.trace, d.timings = time.Now(), w.Trace, nil
			rich, exit := d.runWork(w, true)
			// Before the answer: when the call returns, what it started
			// is gone, whatever it did to its session or group.
			d.endCall()
			if rich != nil {
				_ = d.out.writeJSON(FrameResult, rich)
			}
			_ = d.out.writeJSON(FrameExit, exit)
			d.closeGone()
		case FrameFileOp:
			_ = d.out.writeJSON(FrameFileResult, d.fileOp(m.p))
		case FrameAttach:
			// Another host took the session over; the worker's state is
			// as it was.
			_ = d.out.writeJSON(FrameHello, d.hello.AnswerAttach(m.p))
		case FrameEgress:
			d.setEgress(m.p)
		}
	}
	d.stopWorker()
}

// fileOp runs one file operation in a helper process: this same binary,
// started as the code's user, so that what the code could not read or
// write, the operation cannot either. A helper that dies without an
// answer is started once more: every operation can be repeated (a write
// replaces the whole file), and one CI run saw a helper's JSON decoder
// panic on a 12 MiB write that passed in every rerun.
func (d *driver) fileOp(payload []byte) FileResult {
	res, answered := d.fileOpOnce(payload)
	if !answered {
		res, _ = d.fileOpOnce(payload)
	}
	return res
}

// fileOpOnce runs the helper once; answered is false when it gave no
// result (it died or wrote something else).
func (d *driver) fileOpOnce(payload []byte) (res FileResult, answered bool) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return FileResult{Error: err.Error()}, true
	}
	self, err := os.Executable()
	if err != nil {
		self = Path
	}
	c, err := d.spawn([]string{self, "--fileop", "--workspace", d.workspace},
		spawnOpts{stdin: inR, dir: d.workspace, env: []string{"PATH=/usr/bin:/bin"}})
	inR.Close()
	if err != nil {
		inW.Close()
		return FileResult{Error: "start the file helper: " + err.Error()}, true
	}
	defer c.close()
	go func() {
		_, _ = inW.Write(payload)
		inW.Close()
	}()
	out, err := io.ReadAll(io.LimitReader(c.stdout, MaxFrame))
	pollIn([]int{c.waitFd}, 5*time.Second)
	if err != nil {
		return FileResult{Error: "file helper: " + err.Error()}, false
	}
	if err := json.Unmarshal(out, &res); err != nil {
		msg, _ := io.ReadAll(io.LimitReader(c.stderr, 2048))
		return FileResult{Error: fmt.Sprintf("file helper failed: %s", strings.TrimSpace(string(msg)))}, false
	}
	return res, true
}

// decodeB64 decodes standard base64.
func decodeB64(s string) ([]byte, error) {
	var b []byte
	err := json.Unmarshal([]byte(`"`+s+`"`), &b)
	return b, err
}
