package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/backend/local/boot"
	"github.com/airlock-mcp/airlock/runtime/image"
)

func (a *app) imageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build or import sandbox images"}
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the default sandbox image (Debian bookworm, python3, numpy, pandas, matplotlib); cached",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withStack(cmd, boot.NeedClient, func(ctx context.Context, stack *boot.Stack) error {
				built, err := image.Build(ctx, stack.Client, a.cfg.StateDir, a.cfg.Image, image.DefaultRecipe(image.HostMirror()), a.log)
				if err != nil {
					return err
				}
				if built {
					fmt.Printf("built and imported %s\n", a.cfg.Image)
				} else {
					fmt.Printf("%s is up to date\n", a.cfg.Image)
				}
				return nil
			})
		},
	}
	var tag string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import an OCI or docker image archive",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withStack(cmd, boot.NeedClient, func(ctx context.Context, stack *boot.Stack) error {
				names, err := image.Import(ctx, stack.Client, args[0], tag)
				if err != nil {
					return err
				}
				for _, n := range names {
					fmt.Println(n)
				}
				return nil
			})
		},
	}
	imp.Flags().StringVar(&tag, "tag", "", "also tag the imported image with this reference (e.g. the `image` config value)")
	cmd.AddCommand(build, imp, a.imageServerCmd())
	return cmd
}

// imageServerCmd builds airlock's own image, the one the Kubernetes
// Deployment runs: to a file to push to a registry, or into containerd.
func (a *app) imageServerCmd() *cobra.Command {
	var binary, output, tag string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Build airlock's own image (the Kubernetes Deployment's): one layer with this static airlock binary",
		Long: "Build airlock's own image: the statically linked airlock (this executable, or --binary) and nothing else, run as " + image.ServerUser + ".\n" +
			"With --output it writes an OCI archive (push it with skopeo copy oci-archive:FILE docker://REGISTRY/airlock:TAG);\n" +
			"without, it imports the image into containerd tagged --tag (AIRLOCK_CONTAINERD_NAMESPACE=k8s.io for a node's CRI).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find this executable: %w (give --binary)", err)
				}
				binary = exe
			}
			if output != "" {
				return writeServerImage(output, binary)
			}
			return a.withStack(cmd, boot.NeedClient, func(ctx context.Context, stack *boot.Stack) error {
				dir, err := os.MkdirTemp("", "airlock-server-image-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				archive := filepath.Join(dir, "airlock.oci.tar")
				if err := writeServerImage(archive, binary); err != nil {
					return err
				}
				if _, err := image.Import(ctx, stack.Client, archive, tag); err != nil {
					return err
				}
				fmt.Printf("built and imported %s\n", tag)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&binary, "binary", "", "the airlock executable to put in the image (default: this one); it must be statically linked")
	cmd.Flags().StringVar(&output, "output", "", "write an OCI archive to this file instead of importing into containerd")
	cmd.Flags().StringVar(&tag, "tag", "airlock.local/airlock:dev", "the reference to tag the imported image with (deploy/kubernetes uses this one)")
	return cmd
}

// writeServerImage writes the server image archive to path, whole or not
// at all.
func writeServerImage(path, binary string) (err error) {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("server image: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := image.WriteServerArchive(f, binary); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("server image: %w", err)
	}
	return os.Rename(tmp, path)
}
