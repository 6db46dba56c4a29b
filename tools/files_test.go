package tools

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/airlock-mcp/airlock/config"
	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

func TestPathArg(t *testing.T) {
	cases := []struct {
		args      map[string]any
		allowRoot bool
		want      string // "" with err set: an error containing err
		err       string
	}{
		{map[string]any{"path": "data/in.csv"}, false, "data/in.csv", ""},
		{map[string]any{}, true, "", ""},
		{map[string]any{}, false, "", "missing argument \"path\""},
		{map[string]any{"path": 3.0}, false, "", "must be a string"},
		{map[string]any{"path": "../etc/passwd"}, false, "", `".."`},
		{map[string]any{"path": "/etc/passwd"}, false, "", "absolute"},
		{map[string]any{"path": "a\x00b"}, false, "", "NUL"},
		{map[string]any{"path": strings.Repeat("a", 300)}, false, "", "longer than 255"},
		{map[string]any{"path": "."}, false, "", "names /workspace itself"},
		{map[string]any{"path": "."}, true, ".", ""},
	}
	for _, c := range cases {
		got, err := pathArg(c.args, c.allowRoot)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("pathArg(%v) = %q, %v; want an error with %q", c.args, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("pathArg(%v) = %q, %v; want %q", c.args, got, err, c.want)
		}
	}
}

func TestFileContent(t *testing.T) {
	h := &Handlers{Files: config.FilesConfig{MaxFileMB: 1}}
	big := strings.Repeat("x", 1<<20+1)
	cases := []struct {
		args map[string]any
		want string
		err  string
	}{
		{map[string]any{"content": "a,b\n"}, "a,b\n", ""},
		{map[string]any{"content": ""}, "", ""},
		{map[string]any{"content": "aGk=", "encoding": "base64"}, "hi", ""},
		{map[string]any{"content": "aGk", "encoding": "base64"}, "hi", ""}, // unpadded
		{map[string]any{"content": "%%", "encoding": "base64"}, "", "not valid base64"},
		{map[string]any{"content": "x", "encoding": "latin-1"}, "", `"utf-8" or "base64"`},
		{map[string]any{}, "", "missing argument \"content\""},
		{map[string]any{"content": 1.0}, "", "must be a string"},
		{map[string]any{"content": big}, "", "files.max_file_mb"},
		{map[string]any{"content": base64.StdEncoding.EncodeToString([]byte(big)), "encoding": "base64"}, "", "files.max_file_mb"},
	}
	for _, c := range cases {
		got, _, err := h.fileContent(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("fileContent: err %v, want one with %q", err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("fileContent = %q, %v; want %q", got, err, c.want)
		}
	}
}

func TestRichResult(t *testing.T) {
	png := append([]byte("\x89PNG\r\n\x1a\n"), 1, 2, 3)
	r := runtime.Result{RunID: "r", Rich: &driver.Rich{
		Display: "   a\n0  1",
		Images:  [][]byte{png},
		Files: []driver.OutFile{
			{Path: "out/t.csv", Size: 4, Content: []byte("a,b\n")},
			{Path: "out/b.bin", Size: 2, Content: []byte{0xff, 0}},
			{Path: "out/big", Size: 1 << 20},
		},
		FilesTruncated: true,
	}}
	h := &Handlers{}
	res := h.result("run_python", r, nil)
	out := res.StructuredContent.(RunOutput)
	if out.Display != "   a\n0  1" || out.Images != 1 || len(out.Files) != 3 || !out.Files[0].Embedded || out.Files[2].Embedded || !out.FilesTruncated {
		t.Fatalf("output = %+v", out)
	}
	text := res.Content[0].(mcp.TextContent).Text
	for _, want := range []string{"--- value ---\n   a\n0  1\n", "1 figure(s)", "out/t.csv 4 bytes (content attached)", "out/big 1048576 bytes\n", "rich.max_files"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "(no output)") {
		t.Error("a run with a value says it had no output")
	}
	if len(res.Content) != 4 {
		t.Fatalf("content items = %d, want text, image and two resources", len(res.Content))
	}
	img := res.Content[1].(mcp.ImageContent)
	if data, _ := base64.StdEncoding.DecodeString(img.Data); img.MIMEType != "image/png" || string(data) != string(png) {
		t.Errorf("image = %+v", img)
	}
	text0 := res.Content[2].(mcp.EmbeddedResource).Resource.(mcp.TextResourceContents)
	if text0.URI != "file:///workspace/out/t.csv" || text0.Text != "a,b\n" {
		t.Errorf("text resource = %+v", text0)
	}
	blob := res.Content[3].(mcp.EmbeddedResource).Resource.(mcp.BlobResourceContents)
	if blob.URI != "file:///workspace/out/b.bin" || blob.MIMEType != "application/octet-stream" || blob.Blob != base64.StdEncoding.EncodeToString([]byte{0xff, 0}) {
		t.Errorf("blob resource = %+v", blob)
	}
}
