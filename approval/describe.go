package approval

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Frame lines around the code in a description. Every line between them
// starts with the renderer's gutter (a line number, or the mark of a
// continuation), never at column 0, so code can print anything, these
// lines included, and still not end the frame: the one line that starts
// with "─────" after the first is the real end. The end line repeats the
// line count and the hash, where the human decides.
const (
	framePrefix = "─────"
	codeBegin   = framePrefix + " code: every line below starts with its number; the code ends at the line that starts with " + framePrefix + " ─────"
)

// codeEnd is the frame line after the code.
func codeEnd(lines int, sha string) string {
	return fmt.Sprintf("%s end of code: %d lines, sha256 %s %s", framePrefix, lines, sha, framePrefix)
}

// Describe is the plain-text form of a pending request that a channel
// shows a human: what asks, what it may reach, its limits, and all of its
// code with hidden characters made visible.
func Describe(p *Pending) string {
	r := p.Request
	var b strings.Builder
	fmt.Fprintf(&b, "Approve this %s call?\n", r.Tool)
	transport := ""
	if p.Info.Transport != "" {
		transport = " over " + p.Info.Transport
	}
	fmt.Fprintf(&b, "Client: %s%s\n", r.Client, transport)
	if r.Session != "" {
		fmt.Fprintf(&b, "Session: %s\n", r.Session)
	}
	switch r.Network {
	case NetworkAllowlist:
		fmt.Fprintf(&b, "Network: allow-list: %s\n", listOrNone(r.AllowDomains))
	default:
		b.WriteString("Network: none (loopback only)\n")
	}
	if len(r.Secrets) > 0 {
		fmt.Fprintf(&b, "Secrets: %s (the sandbox sees placeholders; the proxy sends the values to each secret's own hosts only)\n", strings.Join(r.Secrets, ", "))
	}
	if len(p.Info.Grants) > 0 {
		fmt.Fprintf(&b, "⚠ Asks for domains outside the operator's allow-list, granted for this call only if you approve: %s\n", strings.Join(p.Info.Grants, ", "))
	}
	fmt.Fprintf(&b, "Limits: %s\n", DescribeLimits(r.Limits))
	rendered := p.Info.Rendered
	if rendered.Text == "" && r.Code != "" {
		rendered = Render(r.Code)
	}
	fmt.Fprintf(&b, "Code: %d lines, %d bytes, sha256 %s\n", rendered.Lines, len(r.Code), CodeSHA256(r.Code))
	if len(rendered.Warnings) > 0 {
		fmt.Fprintf(&b, "⚠ Made visible: %s\n", strings.Join(rendered.Warnings, "; "))
	}
	if rendered.Numbered == "" && rendered.Text != "" {
		rendered = Render(r.Code) // a Rendered from before numbering
	}
	b.WriteString(codeBegin + "\n")
	if rendered.Numbered != "" {
		b.WriteString(rendered.Numbered + "\n")
	}
	b.WriteString(codeEnd(rendered.Lines, CodeSHA256(r.Code)) + "\n")
	fmt.Fprintf(&b, "Expires %s (in %d s). Approve only what you have read in full.", p.Expires.UTC().Format(time.RFC3339), int(time.Until(p.Expires).Round(time.Second).Seconds()))
	return b.String()
}

// DescribeLimits is the one-line form of a request's limits.
func DescribeLimits(l Limits) string {
	var parts []string
	if l.TimeoutS > 0 {
		parts = append(parts, fmt.Sprintf("timeout %d s", l.TimeoutS))
	}
	if l.MemoryMB > 0 {
		parts = append(parts, fmt.Sprintf("memory %d MiB", l.MemoryMB))
	}
	if l.CPUMillis > 0 {
		parts = append(parts, fmt.Sprintf("%.3g CPU", float64(l.CPUMillis)/1000))
	}
	if l.Pids > 0 {
		parts = append(parts, fmt.Sprintf("%d processes", l.Pids))
	}
	if l.MaxOutputBytes > 0 {
		parts = append(parts, fmt.Sprintf("output %d KiB", l.MaxOutputBytes>>10))
	}
	if len(parts) == 0 {
		return "defaults"
	}
	return strings.Join(parts, ", ")
}

// CodeSHA256 is the hex SHA-256 of code, as the audit log records it.
func CodeSHA256(code string) string {
	sum := sha256.Sum256([]byte(code))
	return hex.EncodeToString(sum[:])
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "(no domains)"
	}
	return strings.Join(l, ", ")
}
