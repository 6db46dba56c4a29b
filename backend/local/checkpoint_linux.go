package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-mcp/airlock/runtime"
	"github.com/airlock-mcp/airlock/runtime/driver"
)

// A checkpoint is a directory under CheckpointsDir: image/ holds what
// `runsc checkpoint` wrote, manifest.json what it is and the SHA-256 of
// every file in image/. The manifest is written last, by rename, so a
// directory without one is a checkpoint that was never finished.

// CheckpointsDir holds deployment's session checkpoints, one directory per
// paused session.
func CheckpointsDir(stateDir, deployment string) string {
	return filepath.Join(stateDir, "checkpoints", deployment)
}

const (
	manifestName    = "manifest.json"
	imageDirName    = "image"
	manifestVersion = 1
)

// manifest describes one checkpoint: whose session it is, what it was made
// with, and the hash of every file, checked before a restore.
type manifest struct {
	Version  int       `json:"version"`
	Session  string    `json:"session"`
	Owner    string    `json:"owner"`
	Created  time.Time `json:"created"`
	LastUsed time.Time `json:"last_used"`
	PausedAt time.Time `json:"paused_at"`
	Idle     int64     `json:"idle_ns"`
	Lifetime int64     `json:"lifetime_ns"`
	Calls    int       `json:"calls"`
	// Limits are the session's sandbox limits.
	Limits runtime.Limits `json:"limits"`
	// Spec is the OCI spec the sandbox ran with: runsc restores only into
	// the same mounts, args, user and limits.
	Spec *specs.Spec `json:"spec"`
	// Runsc and Image are the SHA-256 of the runsc binary and the image's
	// digest: a restore with either changed is refused, since runsc's own
	// version check passes for any two unversioned builds.
	Runsc string         `json:"runsc"`
	Image string         `json:"image"`
	Files []manifestFile `json:"files"`
}

type manifestFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// bytes is the checkpoint's size on disk, as the budget counts it.
func (mf *manifest) bytes() int64 {
	var n int64
	for _, f := range mf.Files {
		n += f.Size
	}
	return n
}

// ErrCheckpointDamaged is wrapped in the error of a restore whose
// checkpoint does not match its manifest.
var ErrCheckpointDamaged = errors.New("the session's checkpoint is damaged")

// restorePoint is a checkpoint image and the spec it must be restored into.
type restorePoint struct {
	image string
	spec  *specs.Spec
}

// specFor is the checkpoint's spec for a sandbox in cgroup cgroupsPath.
func (rp *restorePoint) specFor(cgroupsPath string) *specs.Spec {
	b, _ := json.Marshal(rp.spec)
	var s specs.Spec
	_ = json.Unmarshal(b, &s)
	s.Linux.CgroupsPath = cgroupsPath
	return &s
}

// checkpoint saves sandbox s with `runsc checkpoint` into dir (created).
// The sandbox ends with it unless leaveRunning.
func (m *ContainerdManager) checkpoint(ctx context.Context, s *sandbox, dir string, leaveRunning bool) error {
	if m.o.Shim != ShimRunc {
		return errors.New("checkpoints need the runc shim (runtime.shim: io.containerd.runc.v2)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create checkpoint dir: %w", err)
	}
	// The shim runs runsc with its root per containerd namespace.
	args := []string{"--root", filepath.Join(RunscRoot(m.o.DeploymentID), m.o.Namespace), "checkpoint", "--image-path", dir, "--exclude-committed-zero-pages"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	out, err := exec.CommandContext(ctx, m.o.Runsc, append(args, s.id)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc checkpoint: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runscDigest is the SHA-256 of the runsc binary, computed once.
func (m *ContainerdManager) runscDigest() (string, error) {
	m.runscOnce.Do(func() {
		m.runscSum, m.runscErr = fileSHA256(m.o.Runsc)
	})
	return m.runscSum, m.runscErr
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashImage lists the files of a checkpoint image with their hashes.
func hashImage(dir string) ([]manifestFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []manifestFile
	for _, e := range entries {
		if !e.Type().IsRegular() {
			return nil, fmt.Errorf("checkpoint image holds %s, which is not a regular file", e.Name())
		}
		p := filepath.Join(dir, e.Name())
		sum, err := fileSHA256(p)
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		files = append(files, manifestFile{Name: e.Name(), Size: fi.Size(), SHA256: sum})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}

// newManifest starts the manifest of a checkpoint of s with what a restore
// must match: its spec, the runsc binary's hash, the image's digest.
func (m *ContainerdManager) newManifest(s *sandbox, runsc string) *manifest {
	return &manifest{Spec: s.spec, Runsc: runsc, Image: m.o.Image.Target().Digest.String(), Created: time.Now()}
}

// writeManifest hashes dir's image and writes its manifest, durably.
func writeManifest(dir string, mf *manifest) error {
	files, err := hashImage(filepath.Join(dir, imageDirName))
	if err != nil {
		return fmt.Errorf("hash checkpoint: %w", err)
	}
	mf.Version, mf.Files = manifestVersion, files
	b, err := json.Marshal(mf)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := syncFile(filepath.Join(dir, imageDirName, f.Name)); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, manifestName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, manifestName)); err != nil {
		return fmt.Errorf("install manifest: %w", err)
	}
	return syncFile(dir)
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}

// readManifest reads dir's manifest without checking the image.
func readManifest(dir string) (*manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	var mf manifest
	if err := json.Unmarshal(b, &mf); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrCheckpointDamaged, err)
	}
	if mf.Version != manifestVersion || mf.Spec == nil || mf.Spec.Linux == nil {
		return nil, fmt.Errorf("%w: manifest version %d or spec missing", ErrCheckpointDamaged, mf.Version)
	}
	return &mf, nil
}

// verify checks that dir's image is exactly the manifest's files and that
// it was made with this runsc and image.
func (m *ContainerdManager) verify(dir string, mf *manifest) error {
	runsc, err := m.runscDigest()
	if err != nil {
		return fmt.Errorf("hash runsc: %w", err)
	}
	if mf.Runsc != runsc {
		return errors.New("runsc has changed since the session was paused, and a checkpoint restores only with the runsc that made it")
	}
	if img := m.o.Image.Target().Digest.String(); mf.Image != img {
		return fmt.Errorf("the sandbox image has changed since the session was paused (%s, now %s)", mf.Image, img)
	}
	got, err := hashImage(filepath.Join(dir, imageDirName))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCheckpointDamaged, err)
	}
	want := map[string]manifestFile{}
	for _, f := range mf.Files {
		want[f.Name] = f
	}
	for _, f := range got {
		w, ok := want[f.Name]
		switch {
		case !ok:
			return fmt.Errorf("%w: %s is not in its manifest", ErrCheckpointDamaged, f.Name)
		case w.Size != f.Size:
			return fmt.Errorf("%w: %s has %d bytes, its manifest says %d", ErrCheckpointDamaged, f.Name, f.Size, w.Size)
		case w.SHA256 != f.SHA256:
			return fmt.Errorf("%w: the SHA-256 of %s differs from its manifest's", ErrCheckpointDamaged, f.Name)
		}
		delete(want, f.Name)
	}
	for name := range want {
		return fmt.Errorf("%w: %s is missing", ErrCheckpointDamaged, name)
	}
	return nil
}

// restore makes a sandbox for session sid from the checkpoint in dir, and
// waits for its driver. It returns how long the restore took.
func (m *ContainerdManager) restore(ctx context.Context, sid, dir string, mf *manifest, lim runtime.Limits) (*sandbox, error) {
	rp := &restorePoint{image: filepath.Join(dir, imageDirName), spec: mf.Spec}
	var s *sandbox
	err := m.breaker.Guard(ctx, func() (err error) {
		s, err = m.build(ctx, sid, false, false, lim, rp)
		return err
	})
	if err != nil {
		return nil, err
	}
	if _, err := m.attach(ctx, s); err != nil {
		s.destroy()
		return nil, err
	}
	return s, nil
}

// attach asks a restored sandbox's driver for its Hello: it says it only
// once, at its first start.
func (m *ContainerdManager) attach(ctx context.Context, s *sandbox) (driver.Hello, error) {
	if err := s.st.Send(driver.FrameAttach, []byte(s.id)); err != nil {
		return driver.Hello{}, runtime.Infra("attach restored sandbox", err)
	}
	hctx, cancel := context.WithTimeout(ctx, restoreHelloTimeout)
	defer cancel()
	h, err := s.waitHello(hctx)
	if err != nil {
		return h, runtime.Infra("wait for restored sandbox", err)
	}
	s.step("attached")
	return h, nil
}

// restoreHelloTimeout bounds the wait for a restored driver's Hello.
const restoreHelloTimeout = 30 * time.Second
