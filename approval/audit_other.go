//go:build !linux

package approval

import "os"

// writable has no cheap check off Linux; the write itself will tell.
func writable(*os.File) error { return nil }
