package tools

import (
	"context"
	_ "embed"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/airlock-mcp/airlock/approval"
)

// MCP Apps (extension io.modelcontextprotocol/ui, spec 2026-01-26): a
// client that renders apps shows a run's result, and the code a human is
// asked to approve, in airlock's own views: single HTML files with inline
// script and style, no network (the host's default CSP applies), every
// value inserted as text. A client without apps gets today's text and
// images; nothing depends on the views.

// App resource URIs and their MIME type.
const (
	RunAppURI      = "ui://airlock/run.html"
	ApprovalAppURI = "ui://airlock/approval.html"
	AppMIME        = "text/html;profile=mcp-app"
	// UIExtension is the MCP Apps extension's identifier.
	UIExtension = "io.modelcontextprotocol/ui"
	// approvalMetaKey carries what the approval view shows, in the
	// elicitation's _meta.
	approvalMetaKey = "io.github.airlock/approval"
)

var (
	//go:embed apps/run.html
	runAppHTML string
	//go:embed apps/approval.html
	approvalAppHTML string
	//go:embed apps/rpc.js
	appRPCJS string
)

// appHTML is a view with the shared script in place: one file, as the
// host's CSP wants it.
func appHTML(view string) string {
	return strings.Replace(view, "/*airlock:rpc.js*/", appRPCJS, 1)
}

// registerApps serves the two views as resources.
func registerApps(s *server.MCPServer) {
	for _, a := range []struct{ uri, name, desc, html string }{
		{RunAppURI, "airlock run result", "Shows a run_python or run_shell result: output, the value shown, figures, files.", runAppHTML},
		{ApprovalAppURI, "airlock approval", "Shows the exact code a human is asked to approve, with its warnings.", approvalAppHTML},
	} {
		s.AddResource(mcp.NewResource(a.uri, a.name, mcp.WithMIMEType(AppMIME), mcp.WithResourceDescription(a.desc)),
			func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{mcp.TextResourceContents{URI: a.uri, MIMEType: AppMIME, Text: appHTML(a.html),
					Meta: map[string]any{"ui": map[string]any{"prefersBorder": true}}}}, nil
			})
	}
}

// withRunApp links a run tool to its result view.
func withRunApp(t mcp.Tool) mcp.Tool {
	// Both spellings: ui.resourceUri is the spec's, "ui/resourceUri" the
	// older one some hosts still read.
	t.Meta = mcp.NewMetaFromMap(map[string]any{"ui": map[string]any{"resourceUri": RunAppURI}, "ui/resourceUri": RunAppURI})
	return t
}

// AppsExtension is the server's MCP Apps capability: views, and views that
// answer an elicitation (the approval view).
func AppsExtension() server.ServerOption {
	return server.WithExtensions(map[string]any{UIExtension: map[string]any{"elicitation": map[string]any{}}})
}

// clientRendersApprovalApp reports whether the caller's client declared
// that it renders apps and lets an app answer an elicitation.
func clientRendersApprovalApp(ctx context.Context) bool {
	caps, _ := clientCapabilities(ctx)
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	ui, _ := caps.Extensions[UIExtension].(map[string]any)
	if ui == nil || ui["elicitation"] == nil {
		return false
	}
	types, _ := ui["mimeTypes"].([]any)
	for _, t := range types {
		if t == AppMIME {
			return true
		}
	}
	return false
}

// withApprovalApp points an elicitation at the approval view, with what it
// shows. The answer is the same form answer either way.
func withApprovalApp(params mcp.ElicitationParams, p *approval.Pending) mcp.ElicitationParams {
	v := approval.View(p)
	params.Meta = mcp.NewMetaFromMap(map[string]any{
		"ui": map[string]any{"resourceUri": ApprovalAppURI},
		approvalMetaKey: map[string]any{
			"tool": v.Tool, "numbered": v.Numbered, "warnings": v.Warnings, "grants": v.Grants,
			"limits": v.Limits, "network": v.Network, "allow_domains": v.AllowDomains, "secrets": v.Secrets,
			"lines": v.Lines, "code_sha256": v.CodeSHA256, "expires": v.Expires, "rule": v.Rule,
		},
	})
	return params
}
