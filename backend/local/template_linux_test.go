package local_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/runtime"
)

// restoreManager starts a second manager that makes cold sandboxes with the
// default limits by restoring its template (no pool), and waits for the
// template.
func restoreManager(t *testing.T, concurrency int) *local.ContainerdManager {
	t.Helper()
	s := need(t)
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	o := managerOptions(t, s, slog.LevelWarn)
	// A run's slot is held until its sandbox is gone: the others queue.
	o.Concurrency, o.Queue, o.QueueWait = concurrency, 1000, 10*time.Minute
	o.PoolSize, o.PoolLimits, o.Restore = 0, s.Config.Limits.RunLimits(0), true
	m := startManager(t, s, ctx, o)
	if !local.WaitTemplate(m, 3*time.Minute) {
		t.Fatal("no sandbox template within 3 minutes")
	}
	return m
}

// 100 sandboxes restored from one checkpoint each see exactly what a
// booted sandbox sees, and draw their own random numbers: Python's random,
// numpy's, and uuid4 differ between every two of them.
func TestRestoredSandboxesAreIndistinguishable(t *testing.T) {
	const n = 100
	m := restoreManager(t, 4)
	lim := need(t).Config.Limits.RunLimits(0)
	booted, err := need(t).Manager.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: probe, Limits: lim})
	if err != nil || booted.ExitCode != 0 {
		t.Fatalf("booted probe: %+v %v", booted, err)
	}
	draw := probe + "import random, uuid, numpy\nprint('draw', random.random(), numpy.random.random(), uuid.uuid4())\n"
	var (
		mu    sync.Mutex
		seen  = map[string]int{}
		wg    sync.WaitGroup
		slots = make(chan struct{}, 4)
	)
	for i := range n {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			r, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: draw, Limits: lim, Trace: true})
			if err != nil || r.ExitCode != 0 {
				t.Errorf("restored run %d: %+v %v", i, r, err)
				return
			}
			if _, ok := r.Timings["create.attached"]; !ok {
				t.Errorf("run %d was not restored (timings %v)", i, r.Timings)
			}
			out, drawn, _ := strings.Cut(r.Stdout, "draw ")
			if out != booted.Stdout {
				t.Errorf("run %d sees other than a booted sandbox:\n%s", i, lineDiff(booted.Stdout, out, "booted", "restored"))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, v := range strings.Fields(drawn) {
				seen[v]++
			}
		}()
	}
	wg.Wait()
	if len(seen) != 3*n {
		for v, c := range seen {
			if c > 1 {
				t.Errorf("%d restored sandboxes drew %s", c, v)
			}
		}
		t.Fatalf("%d distinct draws from %d sandboxes, want %d", len(seen), n, 3*n)
	}
}

// lineDiff shows the lines where a and b, named as, differ.
func lineDiff(a, b string, as ...string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var d strings.Builder
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			d.WriteString(as[0] + ": " + x + "\n" + as[1] + ": " + y + "\n")
		}
	}
	return d.String()
}

// A restored sandbox reports to runtime monitoring like a booted one: the
// monitoring config reaches runsc restore too.
func TestRestoredSandboxIsMonitored(t *testing.T) {
	m := restoreManager(t, 1)
	r, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: syscallPy + `sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)`,
		Limits: need(t).Config.Limits.RunLimits(0), Trace: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Timings["create.attached"]; !ok {
		t.Fatal("the run was not restored")
	}
	for _, a := range r.Attempts {
		if a.Kind == "mount" {
			return
		}
	}
	t.Fatalf("no mount attempt reported from a restored sandbox: %+v (stdout %q)", r.Attempts, r.Stdout)
}

// A template that no longer restores costs one run a boot: the run
// succeeds, the template is deleted, and a new one is made.
func TestBrokenTemplateFallsBackToBooting(t *testing.T) {
	m := restoreManager(t, 1)
	img := local.TemplateImage(m)
	ents, err := os.ReadDir(img)
	if err != nil || len(ents) == 0 {
		t.Fatalf("template image: %v %v", ents, err)
	}
	for _, e := range ents {
		if err := os.Truncate(filepath.Join(img, e.Name()), 0); err != nil {
			t.Fatal(err)
		}
	}
	before := local.Restored(m)
	r, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print(6 * 7)", Limits: need(t).Config.Limits.RunLimits(0)})
	if err != nil || r.Stdout != "42\n" {
		t.Fatalf("run with a broken template: %+v %v", r, err)
	}
	if local.Restored(m) != before {
		t.Fatal("a run was restored from the broken template")
	}
	m.WaitTeardowns() // the booted sandbox's, with the same id
	if pids := processesNaming("airlock-" + r.RunID); len(pids) > 0 {
		for _, p := range pids {
			cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
			t.Errorf("process of the failed restore left: %s %q", p, cmd)
		}
	}
	if _, err := os.Stat(filepath.Dir(img)); !os.IsNotExist(err) {
		t.Errorf("broken template kept (err %v)", err)
	}
	if !local.WaitTemplate(m, 3*time.Minute) || local.TemplateImage(m) == img {
		t.Fatal("no new template")
	}
	r, err = m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print(6 * 7)", Limits: need(t).Config.Limits.RunLimits(0)})
	if err != nil || r.Stdout != "42\n" || local.Restored(m) != before+1 {
		t.Fatalf("run from the new template: %+v %v (restored %d)", r, err, local.Restored(m)-before)
	}
}

// A call cancelled at any point of its sandbox's restore leaves nothing
// running: the cancels land before, during and after the restore (a
// dropped HTTP call once left the restored sandbox running, unwaited).
func TestCancelDuringRestoreLeavesNothing(t *testing.T) {
	m := restoreManager(t, 2)
	limits := need(t).Config.Limits.RunLimits(0)
	var ids []string
	for i := range 12 {
		id := runtime.NewRunID()
		ids = append(ids, id)
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(time.Duration(i)*40*time.Millisecond, cancel)
		_, err := m.Run(ctx, runtime.Request{RunID: id, Language: runtime.Python, Code: "import time; time.sleep(30)", Limits: limits})
		timer.Stop()
		cancel()
		if err == nil {
			t.Fatalf("run %d cancelled after %d ms ran to the end", i, i*40)
		}
	}
	m.WaitTeardowns()
	for _, id := range ids {
		if pids := processesNaming("airlock-" + id); len(pids) > 0 {
			t.Errorf("run %s: processes left after its cancel: %v", id, pids)
		}
	}
	// The template survives cancels: they are not restore failures.
	r, err := m.Run(context.Background(), runtime.Request{Language: runtime.Python, Code: "print(6 * 7)", Limits: limits})
	if err != nil || r.Stdout != "42\n" {
		t.Fatalf("run after the cancels: %+v %v", r, err)
	}
}
