// Package image builds, imports and checks the sandbox's container image.
//
// The default image is made here rather than pulled, because the machines
// airlock runs on may reach nothing but a Debian mirror: debootstrap makes a
// root filesystem, a single-layer OCI archive is written from it, and the
// archive is imported into containerd under a local reference.
package image

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"strings"
)

// RecipeVersion is mixed into Recipe.Hash. Bump it whenever the way a rootfs
// or archive is made changes (cleanup, user setup, tar layout), so that hosts
// holding an image from older code rebuild it.
const RecipeVersion = 1

// FallbackMirror is used when the host's apt sources name no Debian mirror.
const FallbackMirror = "http://deb.debian.org/debian"

// DefaultPackages are installed on top of debootstrap's minbase variant:
// python3 with the usual data libraries (python3-minimal lacks most of the
// standard library) and the shell tools scripts expect.
var DefaultPackages = []string{
	"python3",
	"python3-numpy",
	"python3-pandas",
	"python3-matplotlib",
	"python3-pip", // pip install and pip download through the egress proxy
	"coreutils",
	"grep",
	"sed",
	"gawk",
	"findutils",
	"curl",
	"ca-certificates",
	"procps",
	"tzdata",
	// Satisfies python3-fonttools' "python3-scipy | python3-munkres", so
	// matplotlib does not pull in scipy and a C++ toolchain.
	"python3-munkres",
}

// Recipe describes how the default sandbox image is built.
type Recipe struct {
	// Suite is the Debian release, e.g. "bookworm".
	Suite string
	// Mirror is the Debian mirror URL debootstrap downloads from.
	Mirror string
	// Packages are installed in addition to the minbase set.
	Packages []string
	// UID and GID of the unprivileged "sandbox" user code runs as.
	UID, GID int
	// Driver is the sandbox driver binary placed at DriverPath, in a layer
	// of its own, so a new driver does not mean a new debootstrap.
	Driver []byte
}

// DefaultRecipe is the recipe for the default image, fetched from mirror
// (HostMirror() when mirror is empty).
func DefaultRecipe(mirror string) Recipe {
	if mirror == "" {
		mirror = HostMirror()
	}
	driver, _ := Driver() // Build refuses a recipe without one, saying why
	return Recipe{
		Suite:    "bookworm",
		Mirror:   mirror,
		Packages: slices.Clone(DefaultPackages),
		UID:      1000,
		GID:      1000,
		Driver:   driver,
	}
}

// Hash identifies what the recipe produces: a short sha256 hex of its
// contents and RecipeVersion. The mirror is left out on purpose: it says where
// packages come from, not which, and switching mirrors (say to a local proxy)
// should not force a rebuild. Package order and duplicates do not count.
func (r Recipe) Hash() string {
	pkgs := slices.Clone(r.Packages)
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	b, _ := json.Marshal(struct {
		Version  int      `json:"v"`
		Suite    string   `json:"suite"`
		Packages []string `json:"packages"`
		UID      int      `json:"uid"`
		GID      int      `json:"gid"`
	}{RecipeVersion, r.Suite, pkgs, r.UID, r.GID})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// ImageHash identifies the image: the rootfs recipe and the driver. It
// labels the image and names its archive; Hash names the rootfs.
func (r Recipe) ImageHash() string {
	if len(r.Driver) == 0 {
		return r.Hash()
	}
	sum := sha256.Sum256([]byte(r.Hash() + "+driver-" + driverSum(r.Driver)))
	return hex.EncodeToString(sum[:])[:16]
}

// HostMirror returns the Debian mirror the host's apt uses, so the image is
// fetched from wherever this machine is allowed to reach. It reads the
// deb822 /etc/apt/sources.list.d/debian.sources, then /etc/apt/sources.list,
// and falls back to FallbackMirror.
func HostMirror() string {
	return hostMirror("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")
}

func hostMirror(deb822Path, listPath string) string {
	if b, err := os.ReadFile(deb822Path); err == nil {
		if m := mirrorFromDeb822(string(b)); m != "" {
			return m
		}
	}
	if b, err := os.ReadFile(listPath); err == nil {
		if m := mirrorFromList(string(b)); m != "" {
			return m
		}
	}
	return FallbackMirror
}

// mirrorFromDeb822 picks the first enabled "deb" stanza that names a main
// archive (not -security, -updates or -backports).
func mirrorFromDeb822(s string) string {
	for _, stanza := range strings.Split(s, "\n\n") {
		fields := map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(stanza))
		key := ""
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			if (line[0] == ' ' || line[0] == '\t') && key != "" {
				fields[key] += " " + strings.TrimSpace(line)
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			key = strings.ToLower(strings.TrimSpace(k))
			fields[key] = strings.TrimSpace(v)
		}
		if strings.EqualFold(fields["enabled"], "no") ||
			!slices.Contains(strings.Fields(fields["types"]), "deb") {
			continue
		}
		if !hasMainSuite(strings.Fields(fields["suites"])) {
			continue
		}
		for _, u := range strings.Fields(fields["uris"]) {
			if usableMirror(u) {
				return strings.TrimRight(u, "/")
			}
		}
	}
	return ""
}

// mirrorFromList reads one-line-style sources: "deb [opts] URI suite comps".
func mirrorFromList(s string) string {
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) < 2 || !hasMainSuite(f[1:2]) || !usableMirror(f[0]) {
			continue
		}
		return strings.TrimRight(f[0], "/")
	}
	return ""
}

// hasMainSuite reports whether a suite is a release itself ("bookworm"),
// not a pocket such as "bookworm-security" or another vendor's "cloud-sdk-x".
func hasMainSuite(suites []string) bool {
	for _, s := range suites {
		if s != "" && !strings.Contains(s, "-") && !strings.Contains(s, "/") {
			return true
		}
	}
	return false
}

// usableMirror keeps Debian archive URLs debootstrap can fetch from.
func usableMirror(u string) bool {
	if !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/")) {
		return false
	}
	return strings.Contains(u, "debian") && !strings.Contains(u, "security")
}
