package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
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

// LabelRecipe is the containerd image label (and image config label) that
// records which recipe hash an image was built from.
const LabelRecipe = "airlock.recipe"

// imageConfig is the runtime configuration baked into the image.
func imageConfig(r Recipe) *v1.ConfigFile {
	return &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: time.Now().UTC().Truncate(time.Second)},
		Config: v1.Config{
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/workspace",
				"LANG=C.UTF-8",
				// No display in a sandbox: keep matplotlib off GUI backends.
				"MPLBACKEND=Agg",
			},
			User:       fmt.Sprintf("%d:%d", r.UID, r.GID),
			WorkingDir: "/workspace",
			Labels:     map[string]string{LabelRecipe: r.ImageHash()},
		},
	}
}

// writeArchive writes an OCI image-layout tar to dst: the rootfs layer at
// baseLayer (gzip) and a layer with r's driver. It writes dst.tmp and
// renames, so dst is always complete. The archive names no image: one
// archive per image hash serves any ref, and Import tags it.
func writeArchive(baseLayer, dst string, r Recipe) (err error) {
	driverPath := dst + ".driver.tmp"
	tmp := dst + ".tmp"
	defer func() {
		os.Remove(driverPath)
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := writeDriverLayer(driverPath, r.Driver); err != nil {
		return fmt.Errorf("driver layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.ConfigFile(img, imageConfig(r)); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	created := v1.Time{Time: time.Now().UTC().Truncate(time.Second)}
	for _, l := range []struct{ path, by string }{
		{baseLayer, fmt.Sprintf("airlock image build (debootstrap %s, recipe %s)", r.Suite, r.Hash())},
		{driverPath, fmt.Sprintf("airlock sandbox driver %s at %s", driverSum(r.Driver), DriverPath)},
	} {
		// The layers are gzipped once, to files: the archive needs each
		// digest in a tar header before its bytes.
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(l.path) },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer, History: v1.History{CreatedBy: l.by, Created: created}}); err != nil {
			return fmt.Errorf("append layer: %w", err)
		}
	}

	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := writeLayout(f, img); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("rename archive: %w", err)
	}
	return nil
}

// writeDriverLayer writes a gzipped layer holding the driver at DriverPath
// and the empty code directory the runtime mounts a tmpfs on.
func writeDriverLayer(path string, driver []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	mtime := time.Unix(0, 0)
	dirs := []string{"usr/", "usr/lib/", "usr/lib/airlock/", ".airlock/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: DriverPath[1:], Mode: 0o755, Size: int64(len(driver)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		f.Close()
		return err
	}
	if _, err := tw.Write(driver); err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeCompressedLayerAtomic writes the layer of root to path via a
// temporary file, so a crash never leaves a short layer behind.
func writeCompressedLayerAtomic(root, path string) error {
	tmp := path + ".tmp"
	if err := writeCompressedLayer(root, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func writeCompressedLayer(root, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	// BestSpeed: the archive is local and short-lived in transit; a build
	// spends far longer waiting on default-level gzip than on a bigger file.
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return err
	}
	if err := writeLayer(zw, root); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("gzip layer: %w", err)
	}
	return f.Close()
}

// writeLayout writes img as an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) in tar form, the format containerd's Import reads.
func writeLayout(w io.Writer, img v1.Image) error {
	tw := tar.NewWriter(w)
	now := time.Now().Truncate(time.Second)
	addFile := func(name string, size int64, body io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: now}); err != nil {
			return err
		}
		n, err := io.Copy(tw, body)
		if err == nil && n != size {
			err = fmt.Errorf("%s: wrote %d of %d bytes", name, n, size)
		}
		return err
	}
	addBytes := func(name string, b []byte) error {
		return addFile(name, int64(len(b)), bytes.NewReader(b))
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now}); err != nil {
			return err
		}
	}
	if err := addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}

	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		dg, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = addFile("blobs/sha256/"+dg.Hex, size, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("layer blob: %w", err)
		}
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	if err := addBytes("blobs/sha256/"+cfgName.Hex, cfg); err != nil {
		return err
	}
	mf, err := img.RawManifest()
	if err != nil {
		return err
	}
	mfDigest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := addBytes("blobs/sha256/"+mfDigest.Hex, mf); err != nil {
		return err
	}

	desc := v1.Descriptor{
		MediaType: types.OCIManifestSchema1,
		Digest:    mfDigest,
		Size:      int64(len(mf)),
		// containerd's import drops manifests whose platform it cannot
		// match, so say it here as well as in the config.
		Platform: &v1.Platform{OS: "linux", Architecture: "amd64"},
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     []v1.Descriptor{desc},
	})
	if err != nil {
		return err
	}
	if err := addBytes("index.json", index); err != nil {
		return err
	}
	return tw.Close()
}
