package image

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"io/fs"

	"github.com/airlock-mcp/airlock/runtime/driver"
)

//go:embed driverbin
var driverFS embed.FS

// DriverPath is where the sandbox driver lives in the image; it is every
// sandbox's init process.
const DriverPath = driver.Path

// ErrNoDriver means this airlock binary was built without the driver.
var ErrNoDriver = errors.New("this airlock binary carries no sandbox driver: build it with scripts/build.sh (which builds cmd/airlock-driver first)")

// Driver returns the driver binary embedded at build time.
func Driver() ([]byte, error) {
	b, err := fs.ReadFile(driverFS, "driverbin/airlock-driver")
	if err != nil || len(b) == 0 {
		return nil, ErrNoDriver
	}
	return b, nil
}

// driverSum is a short hash of the driver, part of the image's identity.
func driverSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}
