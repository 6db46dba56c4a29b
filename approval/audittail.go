package approval

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// FormatRecord is the one-line, human-readable form of a record that
// `airlock audit tail` prints. It never prints the code itself, only its
// hash and size: the JSON line has it for those who need it.
func FormatRecord(r Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %-10s client=%s", r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), r.ID, r.Tool, r.Client)
	if r.Transport != "" {
		fmt.Fprintf(&b, "/%s", r.Transport)
	}
	fmt.Fprintf(&b, " decision=%s", r.Decision)
	if r.Approver != "" {
		fmt.Fprintf(&b, " by=%s", r.Approver)
	}
	if r.Channel != "" {
		fmt.Fprintf(&b, " via=%s", r.Channel)
	}
	if r.WaitMS > 0 {
		fmt.Fprintf(&b, " waited=%.1fs", float64(r.WaitMS)/1000)
	}
	fmt.Fprintf(&b, " outcome=%s", r.Outcome)
	if r.ExitCode != nil {
		fmt.Fprintf(&b, " exit=%d %.2fs out=%dB err=%dB", *r.ExitCode, float64(r.DurationMS)/1000, r.StdoutBytes, r.StderrBytes)
	}
	if r.LimitHit != "" {
		fmt.Fprintf(&b, " limit=%s", r.LimitHit)
	}
	if r.Truncated {
		b.WriteString(" truncated")
	}
	net := r.Network
	if net == NetworkAllowlist {
		net += "[" + strings.Join(r.AllowDomains, ",") + "]"
	}
	fmt.Fprintf(&b, " net=%s", net)
	if len(r.Granted) > 0 {
		fmt.Fprintf(&b, " granted=%s", strings.Join(r.Granted, ","))
	}
	if len(r.EgressDenied) > 0 {
		fmt.Fprintf(&b, " egress_denied=%s", strings.Join(r.EgressDenied, ","))
	}
	sha := r.CodeSHA256
	if len(sha) > 12 {
		sha = sha[:12]
	}
	fmt.Fprintf(&b, " code=%s/%dB", sha, r.CodeBytes)
	if r.Error != "" {
		fmt.Fprintf(&b, " error=%q", r.Error)
	}
	return b.String()
}

// formatLine formats one line of the log, or says plainly that it is not a
// record, so a damaged log is visible rather than skipped. Seals and the
// genesis line give "": they are skipped, being for `airlock audit verify`,
// and `tail -n N` then still shows N calls.
func formatLine(line []byte) string {
	var r struct {
		Record
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Sprintf("(unreadable line: %v)", err)
	}
	if r.Kind != "" {
		return ""
	}
	return FormatRecord(r.Record)
}

// Tail prints the last n records of the log at path, readably. With follow
// it then prints records as they are appended, across rotations, until ctx
// ends.
func Tail(ctx context.Context, path string, n int, follow bool, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	defer func() { f.Close() }()
	rd := bufio.NewReaderSize(f, 64<<10)
	var last []string
	offset := int64(0)
	for {
		line, err := rd.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break // a partial last line is left for follow to finish
		}
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		offset += int64(len(line))
		l := formatLine(line[:len(line)-1])
		if l == "" {
			continue
		}
		last = append(last, l)
		if n >= 0 && len(last) > n {
			last = last[1:]
		}
	}
	for _, l := range last {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	// The buffered reader read ahead; continue from the last whole line.
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var partial []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		// Rotation renames the file: when the path names another file, or
		// this one shrank, start over on the new one.
		if st, err := os.Stat(path); err == nil {
			cur, _ := f.Stat()
			if cur == nil || !os.SameFile(st, cur) || cur.Size() < offset {
				nf, err := os.Open(path)
				if err == nil {
					// Finish the old file first: records written before the rename.
					if err := copyLines(f, &partial, w); err != nil {
						nf.Close()
						return err
					}
					f.Close()
					f, offset, partial = nf, 0, nil
				}
			}
		}
		if err := copyLines(f, &partial, w); err != nil {
			return err
		}
		if pos, err := f.Seek(0, io.SeekCurrent); err == nil {
			offset = pos
		}
	}
}

// copyLines prints the whole lines f has beyond its position, keeping an
// unfinished one in partial.
func copyLines(f *os.File, partial *[]byte, w io.Writer) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			*partial = append(*partial, buf[:n]...)
			for {
				i := strings.IndexByte(string(*partial), '\n')
				if i < 0 {
					break
				}
				if l := formatLine((*partial)[:i]); l != "" {
					if _, err := fmt.Fprintln(w, l); err != nil {
						return err
					}
				}
				*partial = (*partial)[i+1:]
			}
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
	}
}
