#!/usr/bin/env bash
# serve.sh: the one command that runs airlock on a fresh host. It installs
# what is missing (idempotent), builds the binary, builds the sandbox image
# (cached), then execs `airlock serve` with any arguments given.
# Everything but the MCP stream goes to stderr: stdout belongs to stdio clients.
set -euo pipefail
# Go lives in /usr/local/go on these hosts; a login shell may not have it on PATH.
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
{
  bash scripts/install-deps.sh
  bash scripts/build.sh
  ./bin/airlock image build "$@" 2>&1 | grep -v '^time=' || true
} 1>&2
exec ./bin/airlock serve "$@"
