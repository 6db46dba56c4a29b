#!/usr/bin/env bash
# build.sh: builds bin/airlock; skips the build when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(git describe --always --dirty 2>/dev/null || echo dev)
go build -trimpath -ldflags "-X main.version=$version" -o bin/airlock .
