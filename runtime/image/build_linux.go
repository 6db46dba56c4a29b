package image

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/airlock-mcp/airlock/runtime/flock"
)

// Snapshotter is the snapshotter images are unpacked for: the one the
// sandboxes use, or containerd unpacks again at the first run.
const Snapshotter = "overlayfs"

// LocalPrefix marks references that exist only where they were built:
// Ensure never tries to pull them.
const LocalPrefix = "airlock.local/"

// Build builds the image described by r and imports it into containerd as
// ref, unless containerd already holds ref with LabelRecipe equal to
// r.ImageHash(); then it returns built=false without touching the disk.
//
// Files land in stateDir/images: rootfs-<hash> (the debootstrap tree, kept
// so rebuilds skip the download), layer-<hash>.tar.gz (its layer, kept so a
// new driver skips re-compressing it) and sandbox-<image hash>.tar (the OCI
// archive).
func Build(ctx context.Context, client *containerd.Client, stateDir, ref string, r Recipe, log *slog.Logger) (built bool, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if r.Mirror == "" {
		r.Mirror = HostMirror()
	}
	if len(r.Driver) == 0 {
		return false, ErrNoDriver
	}
	hash := r.ImageHash()
	if ok, err := cached(ctx, client, ref, hash); err != nil || ok {
		return false, err
	}

	dir := filepath.Join(stateDir, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("image dir: %w", err)
	}
	// Two builds at once would debootstrap into the same .tmp.
	unlock, err := flock.Lock(ctx, filepath.Join(dir, ".build.lock"))
	if err != nil {
		return false, err
	}
	defer unlock()
	if ok, err := cached(ctx, client, ref, hash); err != nil || ok {
		return false, err
	}

	start := time.Now()
	archive := filepath.Join(dir, "sandbox-"+hash+".tar")
	if _, err := os.Stat(archive); err != nil {
		rootfs, err := buildRootfs(ctx, dir, r, log)
		if err != nil {
			return false, err
		}
		// The big layer is kept by rootfs recipe: a new driver only adds a
		// small layer of its own.
		base := filepath.Join(dir, "layer-"+r.Hash()+".tar.gz")
		if _, err := os.Stat(base); err != nil {
			log.Info("writing rootfs layer", "path", base)
			if err := writeCompressedLayerAtomic(rootfs, base); err != nil {
				return false, fmt.Errorf("rootfs layer: %w", err)
			}
		}
		log.Info("writing image archive", "path", archive)
		t := time.Now()
		if err := writeArchive(base, archive, r); err != nil {
			return false, fmt.Errorf("image archive: %w", err)
		}
		log.Info("image archive written", "took", time.Since(t).Round(time.Millisecond))
	} else {
		log.Info("reusing image archive", "path", archive)
	}

	t := time.Now()
	if _, err := Import(ctx, client, archive, ref); err != nil {
		return false, err
	}
	// Label last: a build interrupted before this point is not mistaken
	// for a finished one on the next call.
	if _, err := client.ImageService().Update(ctx, images.Image{
		Name:   ref,
		Labels: map[string]string{LabelRecipe: hash},
	}, "labels."+LabelRecipe); err != nil {
		return false, fmt.Errorf("label image %s: %w", ref, err)
	}
	log.Info("image imported", "ref", ref, "recipe", hash,
		"import_took", time.Since(t).Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
	return true, nil
}

// cached reports whether ref exists, carries the recipe label and is
// unpacked; this is all a repeat Build does, so it must stay cheap.
func cached(ctx context.Context, client *containerd.Client, ref, hash string) (bool, error) {
	img, err := client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get image %s: %w", ref, err)
	}
	if img.Labels()[LabelRecipe] != hash {
		return false, nil
	}
	ok, err := img.IsUnpacked(ctx, Snapshotter)
	if err != nil {
		return false, fmt.Errorf("check unpacked %s: %w", ref, err)
	}
	return ok, nil
}

// Import imports an OCI or Docker archive file into containerd, tags its
// image as ref when ref is not empty, and unpacks what it imported so it is
// ready to run. It returns the names of the images created.
func Import(ctx context.Context, client *containerd.Client, path, ref string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	var opts []containerd.ImportOpt
	if ref != "" {
		// Name the archive's index ref in the same pass: works whether or
		// not the archive names its images, and avoids a second import.
		opts = append(opts, containerd.WithIndexName(ref))
	}
	imgs, err := client.Import(ctx, f, opts...)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import %s: no named image in archive; give a reference to tag it", path)
	}
	if ref != "" {
		if err := narrow(ctx, client, ref); err != nil {
			return nil, err
		}
	}
	var names []string
	seen := map[string]bool{}
	for _, m := range imgs {
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		names = append(names, m.Name)
		img, err := client.GetImage(ctx, m.Name)
		if err != nil {
			return nil, fmt.Errorf("get image %s: %w", m.Name, err)
		}
		if err := img.Unpack(ctx, Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack %s: %w", m.Name, err)
		}
	}
	return names, nil
}

// narrow re-points ref from an archive's index to the index's only manifest
// for this platform, so ref is an ordinary image (as a pull would make it)
// rather than a wrapper. With several candidates it stays on the index.
func narrow(ctx context.Context, client *containerd.Client, ref string) error {
	is := client.ImageService()
	img, err := is.Get(ctx, ref)
	if err != nil {
		return fmt.Errorf("get image %s: %w", ref, err)
	}
	if !images.IsIndexType(img.Target.MediaType) {
		return nil
	}
	b, err := content.ReadBlob(ctx, client.ContentStore(), img.Target)
	if err != nil {
		return fmt.Errorf("read index of %s: %w", ref, err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("decode index of %s: %w", ref, err)
	}
	match := platforms.Default()
	var found []ocispec.Descriptor
	for _, m := range idx.Manifests {
		if !images.IsManifestType(m.MediaType) {
			continue
		}
		if m.Platform == nil || match.Match(*m.Platform) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		return nil
	}
	img.Target = found[0]
	if _, err := is.Update(ctx, img, "target"); err != nil {
		return fmt.Errorf("tag %s: %w", ref, err)
	}
	return nil
}

// Ensure returns ref, unpacked and ready to run. A missing remote reference
// is pulled; a missing local one (LocalPrefix) cannot be, so the error says
// how to make it.
func Ensure(ctx context.Context, client *containerd.Client, ref string) (containerd.Image, error) {
	img, err := client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		if strings.HasPrefix(ref, LocalPrefix) {
			return nil, fmt.Errorf("image %s not found: run `airlock image build`", ref)
		}
		img, err = client.Pull(ctx, ref, containerd.WithPullUnpack, containerd.WithPullSnapshotter(Snapshotter))
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
		return img, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get image %s: %w", ref, err)
	}
	ok, err := img.IsUnpacked(ctx, Snapshotter)
	if err != nil {
		return nil, fmt.Errorf("check unpacked %s: %w", ref, err)
	}
	if !ok {
		if err := img.Unpack(ctx, Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack %s: %w", ref, err)
		}
	}
	return img, nil
}
