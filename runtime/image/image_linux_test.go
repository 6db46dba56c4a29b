package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local/daemon"
	"github.com/airlock-mcp/airlock/backend/local/instance"
)

func TestRecipeHash(t *testing.T) {
	a := DefaultRecipe("http://deb.debian.org/debian")
	if a.Hash() != DefaultRecipe("http://deb.debian.org/debian").Hash() {
		t.Fatal("hash not stable")
	}
	if len(a.Hash()) != 16 {
		t.Fatalf("hash %q: want 16 hex chars", a.Hash())
	}

	// Mirror, package order and duplicates do not change what is built.
	b := DefaultRecipe("http://mirror.example/debian")
	b.Packages = append([]string{b.Packages[len(b.Packages)-1]}, b.Packages...)
	if a.Hash() != b.Hash() {
		t.Error("mirror, package order or duplicates changed the hash")
	}

	for name, mut := range map[string]func(*Recipe){
		"suite":    func(r *Recipe) { r.Suite = "trixie" },
		"packages": func(r *Recipe) { r.Packages = append(r.Packages, "jq") },
		"uid":      func(r *Recipe) { r.UID = 1001 },
		"gid":      func(r *Recipe) { r.GID = 1001 },
	} {
		c := DefaultRecipe("")
		mut(&c)
		if c.Hash() == a.Hash() {
			t.Errorf("changing %s did not change the hash", name)
		}
	}
}

func TestHostMirror(t *testing.T) {
	dir := t.TempDir()
	deb822 := filepath.Join(dir, "debian.sources")
	list := filepath.Join(dir, "sources.list")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(deb822, `Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
# comment
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
`)
	if got := hostMirror(deb822, list); got != "http://mirror.example/debian" {
		t.Errorf("deb822: got %q", got)
	}
	write(list, "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"+
		"deb [arch=amd64 signed-by=/x.gpg] http://ftp.example/debian bookworm main\n")
	if got := hostMirror(filepath.Join(dir, "missing"), list); got != "http://ftp.example/debian" {
		t.Errorf("sources.list: got %q", got)
	}
	if got := hostMirror(filepath.Join(dir, "missing"), filepath.Join(dir, "missing")); got != FallbackMirror {
		t.Errorf("fallback: got %q", got)
	}
}

func TestWriteLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown and mknod")
	}
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc/secret"), []byte("hello"), 0o640))
	must(os.Chmod(filepath.Join(root, "etc/secret"), 0o640))
	must(os.Lchown(filepath.Join(root, "etc/secret"), 1000, 1000))
	must(os.Link(filepath.Join(root, "etc/secret"), filepath.Join(root, "etc/hard")))
	must(os.Symlink("../etc/secret", filepath.Join(root, "etc/soft")))
	must(os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	must(os.WriteFile(filepath.Join(root, "dev/leftover"), nil, 0o644))
	must(os.MkdirAll(filepath.Join(root, "proc/1"), 0o755))

	var buf bytes.Buffer
	must(writeLayer(&buf, root))

	hdrs := map[string]*tar.Header{}
	bodies := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		b, _ := io.ReadAll(tr)
		hdrs[h.Name] = h
		bodies[h.Name] = string(b)
	}

	sec, ok := hdrs["etc/secret"]
	if !ok {
		t.Fatalf("etc/secret missing; have %v", keys(hdrs))
	}
	hard := hdrs["etc/hard"]
	// WalkDir is lexical, so etc/hard comes first and carries the bytes.
	if hard == nil || hard.Typeflag != tar.TypeReg || bodies["etc/hard"] != "hello" {
		t.Errorf("etc/hard: want regular file with content, got %+v", hard)
	}
	if sec.Typeflag != tar.TypeLink || sec.Linkname != "etc/hard" {
		t.Errorf("etc/secret: want hardlink to etc/hard, got type %c link %q", sec.Typeflag, sec.Linkname)
	}
	if hard.Mode != 0o640 || hard.Uid != 1000 || hard.Gid != 1000 {
		t.Errorf("etc/hard: mode %o uid %d gid %d, want 640 1000 1000", hard.Mode, hard.Uid, hard.Gid)
	}
	if hard.Uname != "" || hard.Gname != "" {
		t.Errorf("host user names leaked: %q %q", hard.Uname, hard.Gname)
	}
	if s := hdrs["etc/soft"]; s == nil || s.Typeflag != tar.TypeSymlink || s.Linkname != "../etc/secret" {
		t.Errorf("etc/soft: want symlink to ../etc/secret, got %+v", s)
	}
	for _, d := range []string{"etc/", "dev/", "proc/"} {
		if h := hdrs[d]; h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("%s: want directory entry", d)
		}
	}
	for name := range hdrs {
		if strings.HasPrefix(name, "dev/") && name != "dev/" || strings.HasPrefix(name, "proc/") && name != "proc/" {
			t.Errorf("%s: contents of dev/proc must be skipped", name)
		}
		if strings.HasPrefix(name, "/") || strings.Contains(name, root) {
			t.Errorf("%s: host path in layer", name)
		}
	}
}

func keys(m map[string]*tar.Header) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestBuildImport builds the real default image into /var/lib/airlock and
// imports it into containerd (the embedded one, or $AIRLOCK_TEST_CONTAINERD). The rootfs is
// cached there, so only the first run on a machine takes minutes.
func TestBuildImport(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: this test needs root (debootstrap, containerd)")
		}
		t.Skip("needs root")
	}
	stateDir := os.Getenv("AIRLOCK_TEST_STATE_DIR")
	if stateDir == "" {
		stateDir = "/var/lib/airlock"
	}
	// $AIRLOCK_TEST_CONTAINERD names a daemon to use; otherwise the embedded
	// one under stateDir is started (or joined) as airlock itself would.
	sock := os.Getenv("AIRLOCK_TEST_CONTAINERD")
	if sock == "" {
		inst, err := instance.Register(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		d, err := daemon.Acquire(context.Background(), daemon.Options{StateDir: stateDir, Binary: "containerd"})
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("embedded containerd: %v", err)
			}
			_ = inst.Close()
			t.Skipf("embedded containerd: %v", err)
		}
		defer inst.Leave(context.Background(), func(ctx context.Context) { _ = d.Stop(ctx) })
		sock = d.Address
	}
	client, err := containerd.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ns := os.Getenv("AIRLOCK_TEST_NAMESPACE")
	if ns == "" {
		ns = "airlock-test"
	}
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 30*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	const ref = LocalPrefix + "sandbox:test"
	r := DefaultRecipe("")
	start := time.Now()
	if _, err := Build(ctx, client, stateDir, ref, r, log); err != nil {
		t.Fatal(err)
	}
	t.Logf("first Build: %s", time.Since(start))

	rootfs := filepath.Join(stateDir, "images", "rootfs-"+r.Hash())
	out, err := exec.Command("chroot", rootfs, "/usr/bin/python3", "-c", "import numpy, pandas, matplotlib; print('ok')").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("python3 in rootfs: %v: %s", err, out)
	}

	start = time.Now()
	built, err := Build(ctx, client, stateDir, ref, r, log)
	if err != nil {
		t.Fatal(err)
	}
	if built || time.Since(start) > time.Second {
		t.Errorf("second Build: built=%v in %s, want cached and < 1s", built, time.Since(start))
	}

	img, err := Ensure(ctx, client, ref)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := img.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if spec.OS != "linux" || spec.Architecture != "amd64" || spec.Config.User != "1000:1000" || spec.Config.WorkingDir != "/workspace" {
		t.Errorf("image config: %+v", spec)
	}
	if img.Labels()[LabelRecipe] != r.ImageHash() {
		t.Errorf("label %s = %q, want %q", LabelRecipe, img.Labels()[LabelRecipe], r.ImageHash())
	}

	// Re-import the archive under a second name, as `airlock image import` would.
	archive := filepath.Join(stateDir, "images", "sandbox-"+r.ImageHash()+".tar")
	names, err := Import(ctx, client, archive, LocalPrefix+"sandbox:copy")
	if err != nil {
		t.Fatal(err)
	}
	if !contains(names, LocalPrefix+"sandbox:copy") {
		t.Errorf("Import names %v lack the requested ref", names)
	}

	if _, err := Ensure(ctx, client, LocalPrefix+"nope:missing"); err == nil || !strings.Contains(err.Error(), "airlock image build") {
		t.Errorf("Ensure of a missing local image: %v", err)
	}
	// The built ref stays so later runs hit the cache.
	_ = client.ImageService().Delete(ctx, LocalPrefix+"sandbox:copy")
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
