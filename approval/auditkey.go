package approval

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// LoadAuditKey reads the Ed25519 key that signs the audit log's seals. With
// create, a missing key is made (mode 0600); with strict, a key file that
// others may read, or that another user owns, is refused: whoever can read
// the key can rewrite the log and sign it again.
func LoadAuditKey(path string, create, strict bool) (ed25519.PrivateKey, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return nil, fmt.Errorf("audit key: no audit key yet at %s: it is made at the server's first start in state_dir", path)
		}
		return createAuditKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("audit key %s is not a regular file (%s): remove it, and airlock makes a new key at its next start", path, fi.Mode().Type())
	}
	if strict {
		if err := checkKeyFile(path, fi); err != nil {
			return nil, err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	return parseAuditKey(path, data)
}

func parseAuditKey(path string, data []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("audit key %s: not a PEM \"PRIVATE KEY\" block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("audit key %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("audit key %s: a %T, not an Ed25519 key", path, k)
	}
	return ek, nil
}

// createAuditKey writes a new key beside path and links it into place, so
// a crash never leaves half a key and two servers starting at once end up
// using the same one (the second's link fails and it reads the first's).
func createAuditKey(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".audit.key-*") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: writing %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return LoadAuditKey(path, false, true)
		}
		return nil, fmt.Errorf("audit key: %w", err)
	}
	syncDir(dir)
	return priv, nil
}

// checkKeyFile refuses a key others could read or write.
func checkKeyFile(path string, fi os.FileInfo) error {
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("audit key %s has mode %04o: only its owner may read it; run chmod 600 %s", path, perm, path)
	}
	return checkKeyOwner(path, fi)
}

// PublicKeyString is the form of a public key in seals and `airlock audit
// key`: standard base64 of its 32 bytes.
func PublicKeyString(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }

// ParsePublicKey reads a public key as `airlock audit key` prints it, or
// takes the public half of a PEM private key file's content.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-----BEGIN") {
		k, err := parseAuditKey("", []byte(s))
		if err != nil {
			return nil, err
		}
		return k.Public().(ed25519.PublicKey), nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("audit key: %q is not a base64 Ed25519 public key (32 bytes), as `airlock audit key` prints", s)
	}
	return ed25519.PublicKey(b), nil
}

// syncDir persists renames and links in dir; best effort.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
