package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// readLayout returns the blobs of an OCI layout tar by digest hex, and its
// index.
func readLayout(t *testing.T, b []byte) (map[string][]byte, v1.IndexManifest) {
	t.Helper()
	blobs := map[string][]byte{}
	var index v1.IndexManifest
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return blobs, index
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "index.json":
			if err := json.Unmarshal(body, &index); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			blobs[strings.TrimPrefix(h.Name, "blobs/sha256/")] = body
		}
	}
}

// The server image is the static binary at ServerBinary, run as the
// unprivileged ServerUser, and the same binary gives the same image; a
// dynamically linked binary is refused with the fix.
func TestServerArchive(t *testing.T) {
	exe, err := Driver() // static, as the server binary must be
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "airlock")
	if err := os.WriteFile(bin, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if err := WriteServerArchive(&a, bin); err != nil {
		t.Fatal(err)
	}
	if err := WriteServerArchive(&b, bin); err != nil {
		t.Fatal(err)
	}
	blobs, index := readLayout(t, a.Bytes())
	_, index2 := readLayout(t, b.Bytes())
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != index2.Manifests[0].Digest {
		t.Fatalf("manifests %v and %v; want one, the same both times", index.Manifests, index2.Manifests)
	}
	var mf v1.Manifest
	if err := json.Unmarshal(blobs[index.Manifests[0].Digest.Hex], &mf); err != nil {
		t.Fatal(err)
	}
	var cfg v1.ConfigFile
	if err := json.Unmarshal(blobs[mf.Config.Digest.Hex], &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != ServerUser || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != ServerBinary {
		t.Errorf("config user %q entrypoint %v", cfg.Config.User, cfg.Config.Entrypoint)
	}
	if len(mf.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(mf.Layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(blobs[mf.Layers[0].Digest.Hex]))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var found bool
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == ServerBinary[1:] {
			body, _ := io.ReadAll(tr)
			found = bytes.Equal(body, exe) && h.Mode == 0o755
		}
	}
	if !found {
		t.Error("the layer does not hold the binary at " + ServerBinary)
	}

	if err := WriteServerArchive(io.Discard, "/bin/sh"); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("a dynamically linked binary: err %v; want the fix named", err)
	}
}
