#!/usr/bin/env bash
# build.sh: builds the sandbox driver (static, reproducible: it is part of
# the image's identity) and then bin/airlock, which embeds it.
set -euo pipefail
# Go lives in /usr/local/go on these hosts; a login shell may not have it on PATH.
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o runtime/image/driverbin/airlock-driver ./cmd/airlock-driver
version=$(git describe --always --dirty 2>/dev/null || echo dev)
# Static: the same binary runs on a host and in airlock's own image (deploy/kubernetes).
CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$version" -o bin/airlock .
