#!/usr/bin/env bash
# install-deps.sh: installs what airlock needs on a Debian/bookworm host, idempotently.
# Each part is checked first (binary present + version stamp); a second run does nothing.
# Pinned versions live here and nowhere else.
set -euo pipefail
# Go lives in /usr/local/go on these hosts; a login shell may not have it on PATH.
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"

CONTAINERD_VERSION="v2.4.2"
GVISOR_VERSION="v0.0.0-20260905035102-160fafc42237"
BIN_DIR="${AIRLOCK_BIN_DIR:-/usr/local/bin}"
STAMP_DIR="${AIRLOCK_STAMP_DIR:-/usr/local/lib/airlock/stamps}"
# python3: Debian's /usr/bin/python3 serves the tests' own test hosts.
# runc: the benchmark compares gVisor with a plain runc container.
APT_PACKAGES=(containernetworking-plugins nftables iptables iproute2 debootstrap ca-certificates python3 runc)

log() { echo "install-deps: $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (it installs system packages and binaries into $BIN_DIR)"
  exit 1
fi

mkdir -p "$BIN_DIR" "$STAMP_DIR"

# stamped NAME VERSION BINARY... : true when every binary exists and the stamp matches.
stamped() {
  local name=$1 version=$2; shift 2
  [[ -f "$STAMP_DIR/$name" && "$(cat "$STAMP_DIR/$name")" == "$version" ]] || return 1
  local b
  for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

go_build() { # go_build PKG@VERSION OUTNAME [cgo]
  local pkg=$1 out=$2 cgo=${3:-0}
  local tmp
  tmp=$(mktemp -d)
  log "building $pkg (CGO_ENABLED=$cgo)"
  GOBIN="$tmp" CGO_ENABLED="$cgo" GOFLAGS=-buildvcs=false go install "$pkg"
  local built
  built=$(find "$tmp" -maxdepth 1 -type f | head -1)
  install -m 0755 "$built" "$BIN_DIR/$out"
  rm -rf "$tmp"
}

# 1. Debian packages.
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "debian packages present"
fi

# Node.js runs the end-to-end suite; the machine image has it, Debian's is the fallback.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "apt-get install nodejs npm"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# 2. containerd (daemon, ctr, runc shim) from the Go module proxy.
if stamped containerd "$CONTAINERD_VERSION" containerd ctr containerd-shim-runc-v2; then
  log "containerd $CONTAINERD_VERSION present"
else
  # The runc shim must be static like runsc: it is exec'd in odd mount namespaces.
  go_build "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" containerd 1 &
  go_build "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" ctr 0 &
  go_build "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" containerd-shim-runc-v2 0 &
  wait
  echo "$CONTAINERD_VERSION" >"$STAMP_DIR/containerd"
fi

# 3. gVisor: runsc and its shim, static (ENVIRONMENT.md gotcha 1).
if stamped gvisor "$GVISOR_VERSION" runsc containerd-shim-runsc-v1; then
  log "gvisor $GVISOR_VERSION present"
else
  go_build "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" runsc 0 &
  go_build "gvisor.dev/gvisor/shim@$GVISOR_VERSION" containerd-shim-runsc-v1 0 &
  wait
  echo "$GVISOR_VERSION" >"$STAMP_DIR/gvisor"
fi

# 4. The group whose members may use the daemon's socket (server.socket_group).
if getent group airlock >/dev/null; then
  log "group airlock present"
else
  log "groupadd --system airlock"
  groupadd --system airlock
fi

log "ok"
