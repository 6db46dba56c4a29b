package exchange

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// Sandbox is what a backend gives Run for one run: the sandbox's stream
// and how to end it and learn how it ended.
type Sandbox interface {
	Stream() *Stream
	// Exited is closed when the sandbox has ended on its own (killed from
	// outside, most likely for memory); nil when the backend learns that
	// only through the stream.
	Exited() <-chan struct{}
	// Stop kills the whole sandbox when kill is set (SIGKILL to every
	// process: SIGTERM can be ignored, and a child that left the init's
	// group must not survive), then waits until it has ended.
	Stop(kill bool) error
	// ExitStatus is the sandbox's own exit code, once it has ended.
	ExitStatus() (int, error)
	// OutOfMemory reports whether the code's exit (the code's own, or the
	// sandbox's) came from the memory limit, waiting up to d for evidence
	// that may trail the exit.
	OutOfMemory(exit int, d time.Duration) bool
	// Diag is what the driver said on its own stderr.
	Diag() string
	Log() *slog.Logger
}

// exitedGrace is how long output may trail a sandbox's exit.
const exitedGrace = 250 * time.Millisecond

// InterruptWait is how long an interrupted session cell may take to stop
// before its sandbox is killed.
const InterruptWait = 3 * time.Second

// homeFiles are Request.HomeFiles as the work frame carries them.
func homeFiles(files map[string]string) map[string][]byte {
	if len(files) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(files))
	for name, data := range files {
		out[name] = []byte(data)
	}
	return out
}

// Run sends the work and collects its output until the driver reports the
// exit, the timeout passes (the sandbox is killed), or ctx ends.
//
// In a session, running out of time or being cancelled interrupts the
// cell instead: the driver stops it and the session lives on, unless the
// cell does not stop within InterruptWait, when the sandbox is killed and
// the session with it (Result.SessionLost).
func Run(ctx context.Context, sb Sandbox, req runtime.Request, files map[string][]byte, session bool) (runtime.Result, error) {
	res := runtime.Result{RunID: req.RunID}
	st := sb.Stream()
	rich := req.Rich
	// Refused here, before anything is sent: the driver would refuse it
	// too, but its refusal reads as the sandbox's failure.
	if err := runtime.CheckOverlay(req.Env, req.HomeFiles); err != nil {
		return res, err
	}
	payload, err := json.Marshal(driver.Work{Lang: string(req.Language), Code: req.Code, Files: files, Trace: req.Trace, Rich: rich,
		Env: req.Env, HomeFiles: homeFiles(req.HomeFiles)})
	if err != nil {
		return res, fmt.Errorf("encode work frame: %w", err)
	}
	stdout := runtime.NewCappedBuffer(req.Limits.StdoutBytes, runtime.OutputTap(req.Output, runtime.Stdout))
	stderr := runtime.NewCappedBuffer(req.Limits.StderrBytes, runtime.OutputTap(req.Output, runtime.Stderr))
	start := time.Now()
	sent := make(chan time.Duration, 1)
	go func() {
		// Fails only when the sandbox is gone, which the loop sees too.
		_ = st.Send(driver.FrameWork, payload)
		sent <- time.Since(start)
	}()
	timer := time.NewTimer(req.Limits.Timeout)
	defer timer.Stop()

	var exit *driver.Exit
	var killedBy, interruptedBy string
	var grace <-chan time.Time
	take := func(f Frame) {
		switch f.T {
		case driver.FrameStdout:
			_, _ = stdout.Write(f.P)
		case driver.FrameStderr:
			_, _ = stderr.Write(f.P)
		case driver.FrameResult:
			var r driver.Rich
			if json.Unmarshal(f.P, &r) == nil {
				res.Rich = r.Clamp(rich)
			}
		case driver.FrameExit:
			var e driver.Exit
			if json.Unmarshal(f.P, &e) == nil {
				exit = &e
			}
		}
	}
	ctxDone := ctx.Done()
	interrupt := func(why string) {
		if session && interruptedBy == "" {
			interruptedBy = why
			_ = st.Send(driver.FrameInterrupt, nil)
			grace = time.After(InterruptWait)
			ctxDone = nil
			return
		}
		killedBy = why
	}
loop:
	for exit == nil {
		select {
		case f := <-st.Frames():
			take(f)
		case <-st.Gone():
			// The stream ended: whatever frames are left, then the end.
			st.Drain(take)
			break loop
		case <-sb.Exited():
			// The sandbox ended before its driver said so: killed from
			// outside, most likely for memory. The runtime may hold the
			// output stream open after that; take what arrives for a moment.
			last := time.After(exitedGrace)
			for drained := false; !drained; {
				select {
				case f := <-st.Frames():
					take(f)
				case <-st.Gone():
					st.Drain(take)
					drained = true
				case <-last:
					st.Drain(take)
					drained = true
				}
			}
			break loop
		case <-timer.C:
			if interrupt(runtime.ReasonTimeout); killedBy != "" {
				break loop
			}
		case <-ctxDone:
			if interrupt("cancelled"); killedBy != "" {
				break loop
			}
		case <-grace:
			// The cell did not stop: the session goes with its sandbox.
			killedBy = interruptedBy
			break loop
		}
	}
	res.Duration = time.Since(start)
	if exit != nil && interruptedBy != "" {
		// Stopped, the session kept.
		res.Stdout, res.StdoutTruncated = stdout.Result()
		res.Stderr, res.StderrTruncated = stderr.Result()
		res.ExitCode = exit.Code
		res.SessionLost = exit.Lost
		res.LimitsHit = exit.Limits
		if interruptedBy == runtime.ReasonTimeout {
			res.TimedOut, res.Reason = true, runtime.ReasonTimeout
			return res, nil
		}
		return res, ctx.Err()
	}
	if exit != nil {
		res.LimitsHit = exit.Limits
	}
	if req.Trace && exit != nil {
		res.Timings = map[string]float64{"exit_frame": runtime.Millis(res.Duration)}
		select {
		case d := <-sent:
			res.Timings["frame_sent"] = runtime.Millis(d)
		default:
		}
		// The driver's steps, from its own start, on the call's timeline.
		arrived := 0.0
		if at, ok := exit.Timings[driver.ArrivedAt]; ok {
			arrived = at - float64(start.UnixMicro())/1000
			res.Timings["driver.arrived"] = arrived
		}
		for k, v := range exit.Timings {
			if k != driver.ArrivedAt {
				res.Timings["driver."+k] = arrived + v
			}
		}
	}
	if exit == nil {
		if err := sb.Stop(killedBy != ""); err != nil {
			return res, err
		}
		// Output that arrived before the end is kept.
		st.Drain(take)
	}
	res.Stdout, res.StdoutTruncated = stdout.Result()
	res.Stderr, res.StderrTruncated = stderr.Result()
	if res.StdoutTruncated {
		res.Stdout += fmt.Sprintf(runtime.TruncationMarker, req.Limits.StdoutBytes)
	}
	if res.StderrTruncated {
		res.Stderr += fmt.Sprintf(runtime.TruncationMarker, req.Limits.StderrBytes)
	}
	if session && exit == nil {
		res.SessionLost = true // the sandbox is gone
	}
	switch {
	case killedBy == runtime.ReasonTimeout:
		if d := sb.Diag(); d != "" {
			sb.Log().Warn("run timed out; the driver said", "stderr", d)
		}
		res.TimedOut, res.Reason = true, runtime.ReasonTimeout
		res.ExitCode = 128 + int(syscall.SIGKILL)
		return res, nil
	case killedBy != "":
		return res, ctx.Err()
	case exit != nil && exit.Error != "":
		return res, runtime.Infra("start code in sandbox", errors.New(exit.Error))
	case exit != nil:
		res.ExitCode = exit.Code
		res.SessionLost = session && exit.Lost
	default:
		// The sandbox ended without the driver saying how the code did:
		// killed from outside (out of memory), or the driver failed.
		code, err := sb.ExitStatus()
		if err != nil {
			return res, runtime.Infra("sandbox exit status", err)
		}
		res.ExitCode = code
		if res.ExitCode == 0 {
			res.ExitCode = 128 + int(syscall.SIGKILL)
		}
		if !sb.OutOfMemory(res.ExitCode, 500*time.Millisecond) {
			return res, runtime.Infra("sandbox ended unexpectedly", fmt.Errorf("exit %d: %s", code, sb.Diag()))
		}
		res.OOMKilled, res.Reason = true, runtime.ReasonOutOfMemory
		return res, nil
	}
	// A failure may be the memory limit's: a kill by signal 9, or an
	// allocation refused at the limit; the driver says when gVisor killed
	// the code at the limit.
	if res.ExitCode != 0 && (exit.MemoryKilled || sb.OutOfMemory(res.ExitCode, 300*time.Millisecond)) {
		res.OOMKilled, res.Reason = true, runtime.ReasonOutOfMemory
		return res, nil
	}
	switch {
	case res.Truncated():
		res.Reason = runtime.ReasonOutputCapped
	case res.ExitCode > 128:
		res.Reason = runtime.ReasonSignal
	}
	return res, nil
}
