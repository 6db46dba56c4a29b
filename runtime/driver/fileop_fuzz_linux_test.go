package driver

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzFileOp runs file operations on fuzzed paths against a workspace the
// code has booby-trapped with links to a secret outside it. Whatever the
// path, no operation may return the secret, list the outside, or write
// outside the workspace.
//
//	go test -run '^$' -fuzz '^FuzzFileOp$' -fuzztime 5m ./runtime/driver
func FuzzFileOp(f *testing.F) {
	for _, s := range []string{"in.txt", "up/host-only-7f3a", "dir/up/host-only-7f3a", "secret", "../secret", "hard", "dir", "", "link-dir/x", "dir/../up/host-only-7f3a"} {
		for op := byte(0); op < 3; op++ {
			f.Add(s, op)
		}
	}
	base := f.TempDir()
	outside := filepath.Join(base, "outside")
	ws := filepath.Join(base, "ws")
	secret := []byte("the host's secret")
	for _, d := range []string{outside, filepath.Join(ws, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	// The secret's name and content appear nowhere inside the workspace
	// (fuzzed writes add one-byte files, never its content).
	const secretName = "host-only-7f3a"
	if err := os.WriteFile(filepath.Join(outside, secretName), secret, 0o644); err != nil {
		f.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(ws, "in.txt"), []byte("inside"), 0o644)
	for link, target := range map[string]string{"up": outside, "dir/up": outside, "secret": filepath.Join(outside, secretName), "link-dir": "/"} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			f.Fatal(err)
		}
	}
	// A hard link would be a way out too, were the secret on the same
	// filesystem; the sandbox's workspace is its own tmpfs, so it is not.
	f.Fuzz(func(t *testing.T, p string, op byte) {
		var res FileResult
		switch op % 3 {
		case 0:
			res = doFileOp(ws, FileOp{Op: "read", Path: p})
			if bytes.Contains(res.Data, secret) {
				t.Fatalf("read %q returned the secret", p)
			}
		case 1:
			res = doFileOp(ws, FileOp{Op: "list", Path: p})
			for _, e := range res.Entries {
				// A fuzzed write may make a file of that name inside the
				// workspace; its content is one byte, the secret's is not.
				if e.Name == secretName && e.Size == int64(len(secret)) {
					t.Fatalf("list %q listed the outside: %+v", p, res.Entries)
				}
			}
		case 2:
			res = doFileOp(ws, FileOp{Op: "write", Path: p, Data: []byte("x")})
		}
		got, err := os.ReadFile(filepath.Join(outside, secretName))
		entries, _ := os.ReadDir(outside)
		if err != nil || !bytes.Equal(got, secret) || len(entries) != 1 {
			t.Fatalf("op %d on %q changed the outside: %v, %d entries", op%3, p, err, len(entries))
		}
	})
}
