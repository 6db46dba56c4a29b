#!/usr/bin/env bash
# bench.sh: the whole benchmark (`airlock bench`), after installing what is
# missing and building. Results go to bench-results/ (Markdown, JSON, PNG);
# extra arguments pass on to `airlock bench`.
set -euo pipefail
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
{
  bash scripts/install-deps.sh
  bash scripts/build.sh
  ./bin/airlock image build --log-level warn
} 1>&2
exec ./bin/airlock bench --log-level warn "$@"
