// Package guardian runs the process that cleans up after an airlock
// instance that could not: one killed by SIGKILL, or a stdio server that
// left at once when its client closed and handed its teardown over.
//
// The serving process starts the guardian with the read end of a pipe as
// its stdin and keeps the write end. The kernel closes that end when the
// server exits, however it exits, so the guardian learns of it at once
// without polling. A server that tore everything down itself writes
// "done" first; on end-of-file without it, the guardian sweeps the dead
// instance's sandboxes, namespaces, addresses and cgroups. The guardian is
// in a session of its own, so a client that kills the server's process
// group does not take it along.
package guardian

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// doneLine is what a server writes when it left nothing behind.
const doneLine = "done"

// logRotateBytes is the size past which the guardians' shared log is
// moved aside to .1 when the next one starts.
const logRotateBytes = 4 << 20

// Guardian is the serving process's end of its guardian.
type Guardian struct {
	w   *os.File
	cmd *exec.Cmd
}

// Start runs exe with args as this process's guardian. Its output goes to
// logPath (appended), never to this process's stdio: a client that closed
// those pipes must see them close when this process exits.
func Start(exe string, args []string, logPath string) (*Guardian, error) {
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > logRotateBytes {
		_ = os.Rename(logPath, logPath+".1")
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open guardian log: %w", err)
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guardian pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("start guardian: %w", err)
	}
	// Reap it if it ends before this process does.
	go func() { _ = cmd.Wait() }()
	return &Guardian{w: w, cmd: cmd}, nil
}

// PID is the guardian's process id.
func (g *Guardian) PID() int {
	if g == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// Done tells the guardian this process removed everything it made: the
// guardian exits without sweeping.
func (g *Guardian) Done() error {
	if g == nil || g.w == nil {
		return nil
	}
	_, err := io.WriteString(g.w, doneLine+"\n")
	if cerr := g.w.Close(); err == nil {
		err = cerr
	}
	g.w = nil
	return err
}

// HandOff leaves this process's teardown to the guardian, which starts it
// once this process has exited.
func (g *Guardian) HandOff() error {
	if g == nil || g.w == nil {
		return nil
	}
	err := g.w.Close()
	g.w = nil
	return err
}

// Wait is the guardian's side: it reads r until the server's end closes
// and reports whether the server said it left nothing behind.
func Wait(r io.Reader) (clean bool, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, 4096))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == doneLine {
			clean = true
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		return clean, fmt.Errorf("read from server: %w", err)
	}
	return clean, nil
}

// LogPath is where the guardians of state_dir's instances write.
func LogPath(stateDir string) string { return filepath.Join(stateDir, "guardian.log") }
