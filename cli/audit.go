package cli

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/airlock-mcp/airlock/approval"
)

func (a *app) auditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read and check the audit log"}
	var follow bool
	var n int
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print the last audit records readably; -f to follow new ones",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return approval.Tail(cmd.Context(), a.cfg.AuditPath(), n, follow, os.Stdout)
		},
	}
	tail.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing records as they are written")
	tail.Flags().IntVarP(&n, "lines", "n", 20, "how many of the last records to print (-1 for all)")
	cmd.AddCommand(tail, a.auditVerifyCmd(), a.auditKeyCmd())
	return cmd
}

func (a *app) auditVerifyCmd() *cobra.Command {
	var key, keyFile, head string
	verify := &cobra.Command{
		Use:   "verify [FILE]",
		Short: "Check the audit log's hash chain, seals and head; exits non-zero at the first broken record",
		Long: "Checks FILE (default: the configured audit log) and its rotated files FILE.3 … FILE.1, oldest first: " +
			"every line's link to the line before, seq continuity, every seal's signature and, for the configured log, " +
			"that the log ends where state_dir's head says it does.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := approval.VerifyOptions{Head: head}
			path := a.cfg.AuditPath()
			if len(args) == 1 && !samePath(args[0], path) {
				// Another file (a copy, an archive): state_dir's head is not its.
				path = args[0]
			} else if head == "" {
				o.Head = a.cfg.AuditHeadFile()
			}
			o.Files = approval.AuditFiles(path)
			pub, err := a.auditPublicKey(key, keyFile)
			if err != nil {
				return err
			}
			o.Key = pub
			rep, err := approval.VerifyAudit(o)
			var be *approval.BrokenError
			if errors.As(err, &be) {
				fmt.Fprintln(cmd.OutOrStdout(), "broken:", be)
				return exitCode(1)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	verify.Flags().StringVar(&key, "key", "", "the public key seals must be signed with, base64 as `airlock audit key` prints it (default: from state_dir/audit.key)")
	verify.Flags().StringVar(&keyFile, "key-file", "", "a file holding that public key, or the key file itself")
	verify.Flags().StringVar(&head, "head", "", "the chain head file to compare the log's end with (default: state_dir's, for the configured log)")
	return verify
}

func (a *app) auditKeyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "key",
		Short: "Print the public key that signs the audit log's seals (base64)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := approval.LoadAuditKey(a.cfg.AuditKeyFile(), false, false)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), approval.PublicKeyString(k.Public().(ed25519.PublicKey)))
			return nil
		},
	}
}

// auditPublicKey is the key seals are checked with: --key, --key-file, or
// the public half of state_dir's key.
func (a *app) auditPublicKey(key, keyFile string) (ed25519.PublicKey, error) {
	switch {
	case key != "":
		return approval.ParsePublicKey(key)
	case keyFile != "":
		data, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("audit key: %w", err)
		}
		return approval.ParsePublicKey(string(data))
	}
	k, err := approval.LoadAuditKey(a.cfg.AuditKeyFile(), false, false)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("%w (run as root, or pass --key with the output of `airlock audit key`)", err)
		}
		return nil, err
	}
	return k.Public().(ed25519.PublicKey), nil
}

// samePath reports whether two paths name the same file.
func samePath(p, q string) bool {
	if a, err := filepath.Abs(p); err == nil {
		p = a
	}
	if b, err := filepath.Abs(q); err == nil {
		q = b
	}
	if p == q {
		return true
	}
	s1, err1 := os.Stat(p)
	s2, err2 := os.Stat(q)
	return err1 == nil && err2 == nil && os.SameFile(s1, s2)
}
