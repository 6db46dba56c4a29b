#!/usr/bin/env bash
# build.sh: builds bin/airlock; skips the build when nothing changed.
set -euo pipefail
# Go lives in /usr/local/go on these hosts; a login shell may not have it on PATH.
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
version=$(git describe --always --dirty 2>/dev/null || echo dev)
go build -trimpath -ldflags "-X main.version=$version" -o bin/airlock .
