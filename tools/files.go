package tools

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// File encodings of write_file and read_file.
const (
	EncodingUTF8   = "utf-8"
	EncodingBase64 = "base64"
)

// WriteFileOutput is the structuredContent of write_file.
type WriteFileOutput struct {
	Path string `json:"path" jsonschema:"The file written, relative to /workspace"`
	Size int64  `json:"size" jsonschema:"Bytes written"`
	// AuditRecord is the hash of the call's audit line.
	AuditRecord string `json:"audit_record,omitempty" jsonschema:"SHA-256 (hex) of this call's line in the server's audit log; airlock audit verify checks the chain it belongs to"`
}

// ReadFileOutput is the structuredContent of read_file.
type ReadFileOutput struct {
	Path string `json:"path"`
	// Size is the whole file's; Content may hold less (Truncated).
	Size      int64  `json:"size" jsonschema:"Size of the whole file in bytes"`
	Encoding  string `json:"encoding" jsonschema:"utf-8 when the bytes read are valid UTF-8 text, else base64"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated" jsonschema:"True when only the first max_bytes were read"`
}

// ListFilesOutput is the structuredContent of list_files.
type ListFilesOutput struct {
	Path      string      `json:"path"`
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated" jsonschema:"True when the directory has more entries than were listed"`
}

// FileEntry is one directory entry.
type FileEntry struct {
	Name string `json:"name"`
	Type string `json:"type" jsonschema:"file, dir, symlink or other"`
	Size int64  `json:"size"`
}

func (h *Handlers) maxFileBytes() int64 { return int64(h.Files.MaxFileMB) << 20 }

// registerFileTools adds write_file, read_file and list_files.
func (h *Handlers) registerFileTools(s *server.MCPServer) {
	pathDesc := "Path relative to /workspace, such as data/input.csv. Absolute paths and .. are refused; symbolic links are never followed."
	write := []mcp.ToolOption{
		mcp.WithDescription(fmt.Sprintf("Write a file into a session's /workspace (parent directories are created; an existing file is replaced). Up to %d MiB per file; the workspace holds %d MiB in all. Text goes as utf-8; anything else as base64.%s",
			h.Files.MaxFileMB, h.Limits.WorkspaceMB, h.writeApprovalNote())),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithString("path", mcp.Required(), mcp.Description(pathDesc), mcp.MinLength(1), mcp.MaxLength(driver.MaxPathBytes)),
		mcp.WithString("content", mcp.Required(), mcp.Description("The file's content, in the given encoding.")),
		mcp.WithString("encoding", mcp.Enum(EncodingUTF8, EncodingBase64), mcp.Description("utf-8 (default) or base64.")),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[WriteFileOutput](),
		mcp.WithReadOnlyHintAnnotation(false), mcp.WithDestructiveHintAnnotation(true),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	}
	s.AddTool(mcp.NewTool("write_file", append(write, mcp.WithTaskSupport(mcp.TaskSupportOptional))...), h.taskable(h.safe("write_file", h.writeFile)))
	s.AddTool(mcp.NewTool("read_file",
		mcp.WithDescription(fmt.Sprintf("Read a file from a session's /workspace. Text comes back as utf-8, anything else as base64. At most max_bytes (default and maximum %d MiB) are returned.", h.Files.MaxFileMB)),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithString("path", mcp.Required(), mcp.Description(pathDesc), mcp.MinLength(1), mcp.MaxLength(driver.MaxPathBytes)),
		mcp.WithInteger("max_bytes", mcp.Description("Return at most this many bytes from the start of the file."), mcp.Min(1), mcp.Max(float64(h.maxFileBytes()))),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[ReadFileOutput](),
		mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("read_file", h.readFile))
	s.AddTool(mcp.NewTool("list_files",
		mcp.WithDescription("List a directory of a session's /workspace (default: /workspace itself), with each entry's type and size."),
		mcp.WithString("session_id", mcp.Required()),
		mcp.WithString("path", mcp.Description("Directory relative to /workspace; empty or omitted for /workspace itself."), mcp.MaxLength(driver.MaxPathBytes)),
		mcp.WithSchemaAdditionalProperties(false),
		outputSchema[ListFilesOutput](),
		mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true), mcp.WithOpenWorldHintAnnotation(false),
	), h.safe("list_files", h.listFiles))
}

func (h *Handlers) writeApprovalNote() string {
	if h.Gate == nil || h.Gate.Policy.Mode == approval.ModeOff {
		return ""
	}
	return " A human may have to approve the write, as they approve code: a file can be run later."
}

// pathArg reads and checks a path argument.
func pathArg(m map[string]any, allowRoot bool) (string, error) {
	v, present := m["path"]
	if !present || v == nil {
		if allowRoot {
			return "", nil
		}
		return "", argErrorf("missing argument \"path\": a path relative to /workspace, such as data/input.csv")
	}
	p, ok := v.(string)
	if !ok {
		return "", argErrorf("argument \"path\" must be a string, got %s", jsonType(v))
	}
	if _, err := driver.CheckPath(p, allowRoot); err != nil {
		return "", argErrorf("argument \"path\": %v", err)
	}
	return p, nil
}

// fileContent decodes write_file's content argument.
func (h *Handlers) fileContent(m map[string]any) ([]byte, string, error) {
	enc := EncodingUTF8
	if v, present := m["encoding"]; present && v != nil {
		s, ok := v.(string)
		if !ok || (s != EncodingUTF8 && s != EncodingBase64) {
			return nil, "", argErrorf("argument \"encoding\" must be \"utf-8\" or \"base64\", got %s", describe(v))
		}
		enc = s
	}
	v, present := m["content"]
	if !present || v == nil {
		return nil, "", argErrorf("missing argument \"content\" (an empty string writes an empty file)")
	}
	s, ok := v.(string)
	if !ok {
		return nil, "", argErrorf("argument \"content\" must be a string, got %s", jsonType(v))
	}
	data := []byte(s)
	if enc == EncodingBase64 {
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(s)); err != nil {
			if data, err = base64.RawStdEncoding.DecodeString(strings.TrimSpace(s)); err != nil {
				return nil, "", argErrorf("argument \"content\" is not valid base64 (standard alphabet): %v", err)
			}
		}
	}
	if int64(len(data)) > h.maxFileBytes() {
		return nil, "", argErrorf("the file would be %d bytes, over the limit of %d MiB (files.max_file_mb): split it, or create it with code in the sandbox", len(data), h.Files.MaxFileMB)
	}
	return data, enc, nil
}

// fileError turns a session's refusal of a file operation into a result,
// forgetting a session that has ended.
func (h *Handlers) fileError(e *sessionEntry, err error) *mcp.CallToolResult {
	var ie *runtime.InfraError
	switch {
	case errors.Is(err, runtime.ErrSessionBusy):
		return mcp.NewToolResultError(fmt.Sprintf("Session %s is busy with another call; retry when it has finished.", e.id))
	case errors.Is(err, runtime.ErrSessionClosed):
		h.sessions.remove(e.id)
		return mcp.NewToolResultError(fmt.Sprintf("Session %s has ended (%v); start another with session_create.", e.id, err))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return mcp.NewToolResultError("The call was cancelled.")
	case errors.As(err, &ie):
		h.Log.Error("session file operation failed", "session", e.id, "op", ie.Op, "err", ie.Err)
		return infraResult(ie.Op)
	default:
		h.Log.Error("session file operation failed", "session", e.id, "err", err)
		return infraResult("file operation")
	}
}

// writeFile is write_file. It is gated and recorded like code: a file
// written now can be run by a later call whose approver never saw it.
func (h *Handlers) writeFile(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := h.newCall(ctx, "write_file")
	e, m, res := h.sessionArg(ctx, req, "write_file", "path", "content", "encoding")
	if res != nil {
		return c.fail(approval.OutcomeInvalid, res), nil
	}
	c.rec.Session = e.id
	defer h.useSession(e)()
	p, err := pathArg(m, false)
	if err != nil {
		return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error())), nil
	}
	c.rec.Path = p
	data, enc, err := h.fileContent(m)
	if err != nil {
		return c.fail(approval.OutcomeInvalid, mcp.NewToolResultError(err.Error())), nil
	}
	c.rec.CodeSHA256, c.rec.CodeBytes = approval.CodeSHA256(string(data)), len(data)
	text := enc == EncodingUTF8 && utf8.Valid(data)
	if h.AuditCode && text && len(data) <= h.Limits.CodeBytes {
		c.rec.Code = string(data)
	}
	// What a human approves: the path and the exact bytes (the text
	// itself, or the hash of binary content).
	shown := fmt.Sprintf("# write_file %s (%d bytes)\n", p, len(data))
	if text {
		shown += string(data)
	} else {
		shown += fmt.Sprintf("# binary content, sha256 %s\n", c.rec.CodeSHA256)
	}
	areq := approval.Request{Tool: "write_file", Code: shown, Network: e.network, Session: e.id, Client: c.caller.ID}
	if e.policy != nil {
		areq.AllowDomains = e.policy.Domains()
	}
	c.rec.Network, c.rec.AllowDomains = areq.Network, areq.AllowDomains
	if res := c.approve(ctx, req, areq, nil); res != nil {
		return res, nil
	}
	if res := c.auditReady(); res != nil {
		return res, nil
	}
	fr, err := e.s.File(ctx, driver.FileOp{Op: "write", Path: p, Data: data})
	if err != nil {
		outcome := approval.OutcomeInfra
		switch {
		case errors.Is(err, runtime.ErrSessionBusy):
			outcome = approval.OutcomeBusy
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			outcome = approval.OutcomeCancelled
		}
		return c.fail(outcome, h.fileError(e, err)), nil
	}
	if fr.Error != "" {
		return c.fail(approval.OutcomeFileError, mcp.NewToolResultError("Not written: "+fr.Error)), nil
	}
	c.rec.Outcome = approval.OutcomeRan
	out := WriteFileOutput{Path: p, Size: fr.Size}
	return c.finish(structured(out, fmt.Sprintf("Wrote %d bytes to /workspace/%s.", fr.Size, p))), nil
}

func (h *Handlers) readFile(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e, m, res := h.sessionArg(ctx, req, "read_file", "path", "max_bytes")
	if res != nil {
		return res, nil
	}
	defer h.useSession(e)()
	p, err := pathArg(m, false)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	max := h.maxFileBytes()
	if v, present := m["max_bytes"]; present && v != nil {
		f, ok := v.(float64)
		if !ok || f != math.Trunc(f) || f < 1 || f > float64(max) {
			return mcp.NewToolResultError(fmt.Sprintf("argument \"max_bytes\" must be a whole number from 1 to %d (files.max_file_mb), got %s", max, describe(v))), nil
		}
		max = int64(f)
	}
	fr, err := e.s.File(ctx, driver.FileOp{Op: "read", Path: p, MaxBytes: max})
	if err != nil {
		return h.fileError(e, err), nil
	}
	if fr.Error != "" {
		return mcp.NewToolResultError("Not read: " + fr.Error), nil
	}
	out := ReadFileOutput{Path: p, Size: fr.Size, Truncated: fr.Truncated, Encoding: EncodingUTF8, Content: string(fr.Data)}
	if !utf8.Valid(fr.Data) {
		out.Encoding, out.Content = EncodingBase64, base64.StdEncoding.EncodeToString(fr.Data)
	}
	head := fmt.Sprintf("/workspace/%s: %d bytes", p, fr.Size)
	if fr.Truncated {
		head += fmt.Sprintf(", the first %d shown", len(fr.Data))
	}
	if out.Encoding == EncodingBase64 {
		head += ", binary, as base64"
	}
	return structured(out, head+"\n"+out.Content), nil
}

func (h *Handlers) listFiles(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	e, m, res := h.sessionArg(ctx, req, "list_files", "path")
	if res != nil {
		return res, nil
	}
	defer h.useSession(e)()
	p, err := pathArg(m, true)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	fr, err := e.s.File(ctx, driver.FileOp{Op: "list", Path: p})
	if err != nil {
		return h.fileError(e, err), nil
	}
	if fr.Error != "" {
		return mcp.NewToolResultError("Not listed: " + fr.Error), nil
	}
	out := ListFilesOutput{Path: p, Entries: []FileEntry{}, Truncated: fr.Truncated}
	var b strings.Builder
	fmt.Fprintf(&b, "/workspace/%s: %d entries\n", p, len(fr.Entries))
	for _, en := range fr.Entries {
		out.Entries = append(out.Entries, FileEntry(en))
		fmt.Fprintf(&b, "%-7s %10d %s\n", en.Type, en.Size, en.Name)
	}
	if fr.Truncated {
		b.WriteString("(more entries not listed)\n")
	}
	return structured(out, b.String()), nil
}
