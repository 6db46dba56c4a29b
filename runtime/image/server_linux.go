package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ServerBinary is where airlock's own image keeps the airlock executable.
const ServerBinary = "/usr/local/bin/airlock"

// ServerUser is the unprivileged uid:gid airlock's own image runs as (the
// Deployment's runAsUser).
const ServerUser = "65532:65532"

// WriteServerArchive writes an OCI image-layout tar of airlock's own image
// (what the Kubernetes Deployment runs): one layer holding the statically
// linked airlock at binary, nothing else, run as ServerUser. The same
// binary gives the same image digest.
func WriteServerArchive(w io.Writer, binary string) error {
	exe, err := os.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("server image: %w", err)
	}
	if err := checkStatic(exe); err != nil {
		return fmt.Errorf("server image: %s: %w", binary, err)
	}
	var layer bytes.Buffer
	if err := writeServerLayer(&layer, exe); err != nil {
		return fmt.Errorf("server image layer: %w", err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("server image layer: %w", err)
	}
	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux", Created: epoch,
		Config: v1.Config{
			Entrypoint: []string{ServerBinary},
			Cmd:        []string{"serve", "--transport", "http"},
			User:       ServerUser,
			Env:        []string{"PATH=/usr/local/bin"},
		},
	})
	if err != nil {
		return fmt.Errorf("server image config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
		History: v1.History{CreatedBy: "airlock image server", Created: epoch}})
	if err != nil {
		return fmt.Errorf("server image: %w", err)
	}
	return writeLayout(w, img)
}

// checkStatic refuses a dynamically linked executable: the image has no
// libc for it.
func checkStatic(exe []byte) error {
	f, err := elf.NewFile(bytes.NewReader(exe))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked; build it with CGO_ENABLED=0 (scripts/build.sh does)")
		}
	}
	return nil
}

// writeServerLayer writes the gzipped layer: the binary, and the empty
// directories airlock's pod mounts its state and /tmp on.
func writeServerLayer(w io.Writer, exe []byte) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	mtime := time.Unix(0, 0)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/", "etc/", "etc/airlock/", "tmp/", "var/", "var/lib/", "var/lib/airlock/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: ServerBinary[1:], Mode: 0o755, Size: int64(len(exe)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := tw.Write(exe); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
