package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// Restore instead of boot: once per process, airlock boots one sandbox
// with the pool's limits and its Python worker's modules imported,
// checkpoints it (the template), and from then on makes pooled sandboxes,
// and cold ones whose limits are the pool's, by restoring that checkpoint:
// runsc restore in place of runsc create + start + Python's imports. A
// restored driver is asked for its Hello (attach), which also has the
// worker reseed its random generators, so no two clones draw the same
// numbers. Networked sandboxes still boot: a template has no network.
//
// The template lives under TemplatesDir/<instance> and goes with the
// instance; it is made again after a restart, and after any restore from
// it fails (the failed sandbox boots instead).

// TemplatesDir holds each instance's sandbox template.
func TemplatesDir(stateDir string) string { return filepath.Join(stateDir, "templates") }

// template is a checkpoint sandboxes are restored from.
type template struct {
	dir string
	mf  *manifest
}

// templates makes and hands out the manager's template.
type templates struct {
	mu     sync.Mutex
	t      *template
	making bool
	// failures counts templates that could not be made in a row: making
	// stops after a few, and sandboxes boot.
	failures int
	// restored counts sandboxes restored from templates.
	restored atomic.Int64
}

// templateMaxFailures stops template making after this many failures.
const templateMaxFailures = 3

// restores reports whether sandboxes are restored from a template here.
func (m *ContainerdManager) restores() bool {
	return m.o.Restore && m.o.Shim == ShimRunc && m.o.PoolLimits.MemoryBytes > 0
}

// templateFor returns the template a sandbox with these limits may be
// restored from, or nil; with none yet, it starts making one.
func (m *ContainerdManager) templateFor(networked bool, lim runtime.Limits) *template {
	if !m.restores() || networked || !m.o.PoolLimits.SameSandbox(lim) {
		return nil
	}
	m.tmpl.mu.Lock()
	defer m.tmpl.mu.Unlock()
	if m.tmpl.t == nil && !m.tmpl.making && m.tmpl.failures < templateMaxFailures {
		m.tmpl.making = true
		go m.makeTemplate()
	}
	return m.tmpl.t
}

// templateDir is this instance's template directory.
func (m *ContainerdManager) templateDir() string {
	return filepath.Join(TemplatesDir(m.o.StateDir), m.o.InstanceID)
}

// makeTemplate boots a warm sandbox, checkpoints it as the template, and
// destroys it.
func (m *ContainerdManager) makeTemplate() {
	t, err := m.buildTemplate()
	m.tmpl.mu.Lock()
	defer m.tmpl.mu.Unlock()
	m.tmpl.making = false
	if err != nil {
		m.tmpl.failures++
		m.o.Log.Warn("sandbox template not made; sandboxes boot meanwhile", "err", err, "failures", m.tmpl.failures)
		return
	}
	m.tmpl.failures = 0
	m.tmpl.t = t
}

func (m *ContainerdManager) buildTemplate() (*template, error) {
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	start := time.Now()
	runsc, err := m.runscDigest()
	if err != nil {
		return nil, fmt.Errorf("hash runsc: %w", err)
	}
	s, err := m.create(ctx, "t"+runtime.NewRunID()[1:], true, false, m.o.PoolLimits)
	if err != nil {
		return nil, err
	}
	defer s.destroy()
	h, err := s.waitHello(ctx)
	switch {
	case err != nil:
		return nil, fmt.Errorf("wait for template sandbox: %w", err)
	case !h.Preloaded:
		return nil, fmt.Errorf("template sandbox's worker preload failed: %s", h.PreloadError)
	}
	dir := filepath.Join(m.templateDir(), runtime.NewRunID())
	if err := m.checkpoint(ctx, s, filepath.Join(dir, imageDirName), false); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	mf := m.newManifest(s, runsc)
	if err := writeManifest(dir, mf); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	m.o.Log.Info("sandbox template made", "bytes", mf.bytes(), "took", time.Since(start))
	return &template{dir: dir, mf: mf}, nil
}

// dropTemplate forgets t after a restore from it failed, and deletes it:
// the next sandbox boots and a new template is made.
func (m *ContainerdManager) dropTemplate(t *template, why error) {
	m.tmpl.mu.Lock()
	if m.tmpl.t == t {
		m.tmpl.t = nil
	}
	m.tmpl.mu.Unlock()
	m.o.Log.Warn("restore from the sandbox template failed; it is made again", "err", why)
	_ = os.RemoveAll(t.dir)
}

// restoreWarm makes a sandbox, pooled or for run sid, by restoring t, and
// waits for its driver. On failure the template is dropped, and the caller
// boots instead.
func (m *ContainerdManager) restoreWarm(ctx context.Context, t *template, sid string, pooled bool, lim runtime.Limits) (*sandbox, error) {
	s, err := m.build(ctx, sid, pooled, false, lim, &restorePoint{image: filepath.Join(t.dir, imageDirName), spec: t.mf.Spec})
	if err == nil {
		var h driver.Hello
		// Restored is sent before the attach: the worker reseeds and
		// touches its memory in before the Hello that says it is ready.
		var touch []byte
		if pooled {
			touch = []byte("touch")
		}
		if err = s.st.Send(driver.FrameRestored, touch); err != nil {
			err = runtime.Infra("tell restored sandbox", err)
		} else if h, err = m.attach(ctx, s); err == nil && !h.Preloaded {
			err = errors.New("the restored worker is not ready")
		}
		if err != nil {
			s.destroy()
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			m.dropTemplate(t, err)
		}
		return nil, err
	}
	s.restored = true
	m.tmpl.restored.Add(1)
	return s, nil
}

// removeTemplates deletes this instance's templates (Close).
func (m *ContainerdManager) removeTemplates() error {
	if err := os.RemoveAll(m.templateDir()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove templates: %w", err)
	}
	return nil
}

// WaitTemplate waits until sandboxes are restored from a template: at once
// when restores are off, with an error when the template cannot be made.
func (m *ContainerdManager) WaitTemplate(ctx context.Context) error {
	for {
		if !m.restores() || m.templateFor(false, m.o.PoolLimits) != nil {
			return nil
		}
		m.tmpl.mu.Lock()
		failed := m.tmpl.failures >= templateMaxFailures
		m.tmpl.mu.Unlock()
		if failed {
			return errors.New("the sandbox template could not be made")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
