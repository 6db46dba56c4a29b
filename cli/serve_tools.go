package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/airlock-mcp/airlock/approval"
	"github.com/airlock-mcp/airlock/metrics"
	"github.com/airlock-mcp/airlock/runtime/network/egress"
	"github.com/airlock-mcp/airlock/tools"
)

// handlers builds the tool handlers of a running stack: the approval gate,
// the audit log and, when approval is on, the web console. The returned
// function stops them in reverse order.
func (a *app) handlers(ctx context.Context, s *backend) (*tools.Handlers, func(), error) {
	cfg := a.cfg
	h := &tools.Handlers{
		Manager: s.Manager, Limits: cfg.Limits, Log: a.log,
		Egress: s.Egress, DefaultNetwork: cfg.Network.Mode, Secrets: s.Secrets, Tripwires: s.Tripwires,
		AuditCode: cfg.Audit.IncludeCode,
		Sessions:  cfg.Sessions, Files: cfg.Files, Rich: cfg.Rich, Tasks: cfg.Tasks,
	}
	metrics.SetSessionsActive(h.SessionsActive)
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if cfg.Audit.Enabled {
		var mirror io.Writer
		if cfg.Audit.Stdout {
			mirror = os.Stdout // the cluster's log pipeline collects it
		}
		h.Audit = approval.NewAuditWith(approval.AuditOptions{
			Path: cfg.AuditFile(), MaxBytes: int64(cfg.Audit.MaxMB) << 20, Mirror: mirror,
			KeyFile: cfg.AuditKeyFile(), HeadFile: cfg.AuditHeadFile(), SealEvery: cfg.Audit.SealEvery,
		})
		if err := h.Audit.Check(); err != nil {
			// Serve anyway: every call then says why it cannot run, which a
			// desktop user sees; a server that exits shows them nothing.
			a.log.Error("audit log not writable: no code will run until it is", "path", cfg.AuditFile(), "err", err)
		}
		closers = append(closers, func() { _ = h.Audit.Close() })
	}
	pol, err := approval.ParsePolicy(cfg.Approval.Mode, cfg.Approval.Rules)
	if err != nil {
		return nil, nil, err
	}
	h.Gate = approval.NewGate(pol, cfg.Approval.Timeout)
	closers = append(closers, h.Close)
	if !cfg.Approval.Enabled() {
		return h, closeAll, nil
	}
	if len(cfg.Approval.GrantableDomains) > 0 && s.Egress != nil {
		gp, err := egress.ParsePolicy(cfg.Approval.GrantableDomains, cfg.Network.AllowPorts, nil)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("approval.grantable_domains: %w", err)
		}
		h.Grantable = &gp
	}
	if cfg.Approval.Console.Listen != "" {
		if s.Board != nil {
			// Every replica's console shows and decides every replica's requests.
			h.Gate.UseBoard(ctx, s.Board, a.log)
		}
		stop, err := a.startConsole(ctx, h.Gate)
		if err != nil {
			// Another airlock on this host may hold the port: this one still
			// asks through elicitation, and says so.
			a.log.Warn("approval console not started; calls needing approval must use elicitation", "listen", cfg.Approval.Console.Listen, "err", err)
		} else {
			closers = append(closers, stop)
		}
	}
	return h, closeAll, nil
}

// startConsole serves the approval console on approval.console.listen.
func (a *app) startConsole(ctx context.Context, g *approval.Gate) (func(), error) {
	cfg := a.cfg
	tokens, err := approval.LoadTokens(cfg.ConsoleTokenFile(), true)
	if err != nil {
		return nil, err
	}
	hosts, err := approval.ConsoleHosts(cfg.Approval.Console.Listen, cfg.Approval.Console.Hosts)
	if err != nil {
		return nil, err
	}
	console, err := approval.NewConsole(g, approval.ConsoleOptions{Tokens: tokens, Hosts: hosts, Log: a.log.With("component", "console")})
	if err != nil {
		return nil, err
	}
	addr, stop, err := a.serveSide(ctx, cfg.Approval.Console.Listen, console, "approval console")
	if err != nil {
		return nil, err
	}
	g.SetConsole(true)
	a.log.Info("approval console listening", "url", "http://"+addr.String()+"/", "token_file", cfg.ConsoleTokenFile())
	return func() {
		g.SetConsole(false)
		stop()
	}, nil
}
