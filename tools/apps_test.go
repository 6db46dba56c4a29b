package tools

import (
	"context"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func TestClientRendersApprovalApp(t *testing.T) {
	ui := func(m map[string]any) map[string]any { return map[string]any{UIExtension: m} }
	for _, tc := range []struct {
		name string
		caps *mcp.ClientCapabilities
		want bool
	}{
		{"no capabilities", nil, false},
		{"elicitation, no apps", &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{}}, false},
		{"apps without app elicitation", &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{},
			Extensions: ui(map[string]any{"mimeTypes": []any{AppMIME}})}, false},
		{"app elicitation, other MIME type", &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{},
			Extensions: ui(map[string]any{"mimeTypes": []any{"text/html"}, "elicitation": map[string]any{}})}, false},
		{"app elicitation without elicitation", &mcp.ClientCapabilities{
			Extensions: ui(map[string]any{"mimeTypes": []any{AppMIME}, "elicitation": map[string]any{}})}, false},
		{"all of it", &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapability{},
			Extensions: ui(map[string]any{"mimeTypes": []any{AppMIME}, "elicitation": map[string]any{}})}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := server.WithRequestProtocolInfo(context.Background(), &server.RequestProtocolInfo{Modern: true, ClientCapabilities: tc.caps})
			if got := clientRendersApprovalApp(ctx); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAppViewsAreServedAndLinked(t *testing.T) {
	s := server.NewMCPServer("airlock", "test", server.WithResourceCapabilities(false, false))
	registerApps(s)
	for _, uri := range []string{RunAppURI, ApprovalAppURI} {
		resp := s.HandleMessage(context.Background(), []byte(`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"`+uri+`"}}`))
		r, ok := resp.(mcp.JSONRPCResponse)
		if !ok {
			t.Fatalf("%s: %#v", uri, resp)
		}
		res := r.Result.(mcp.ReadResourceResult)
		c := res.Contents[0].(mcp.TextResourceContents)
		// One file, no fetches: the host's default CSP allows nothing else.
		if c.MIMEType != AppMIME || !strings.Contains(c.Text, "ui/initialize") || strings.Contains(c.Text, "src=\"http") || strings.Contains(c.Text, "innerHTML") || strings.Contains(c.Text, "airlock:rpc.js") {
			t.Fatalf("%s: mime %q, %d bytes", uri, c.MIMEType, len(c.Text))
		}
	}
	tool := withRunApp(mcp.NewTool("run_python"))
	if ui, _ := tool.Meta.AdditionalFields["ui"].(map[string]any); ui["resourceUri"] != RunAppURI {
		t.Fatalf("tool _meta %#v", tool.Meta)
	}
}
