package cli

import (
	"context"
	"fmt"

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
	cmd.AddCommand(build, imp)
	return cmd
}
