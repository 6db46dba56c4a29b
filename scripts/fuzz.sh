#!/usr/bin/env bash
# fuzz.sh: run every fuzz target for a fixed number of executions each
# (FUZZ_BUDGET, default 50000x). Counts, not durations: with a duration Go 1.26's
# coordinator can report a spurious "context deadline exceeded" at the boundary
# (golang/go#75804). For a longer hunt: FUZZ_BUDGET=10m bash scripts/fuzz.sh,
# or one target: go test -run '^$' -fuzz '^FuzzFileOp$' -fuzztime 30m ./runtime/driver
# A failing input is written under the package's testdata/fuzz/<Target>/;
# commit it so the plain `go test` replays it from then on.
set -euo pipefail
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
budget="${FUZZ_BUDGET:-50000x}"
targets=(
  "FuzzParseRunArgs ./tools"
  "FuzzCheckPath ./runtime/driver"
  "FuzzFileOp ./runtime/driver"
  "FuzzReader ./runtime/driver"
  "FuzzProxyRequest ./runtime/network/egress"
  "FuzzParseClientHello ./runtime/network/egress"
  "FuzzScanner ./runtime/network/egress"
  "FuzzRender ./approval"
  "FuzzDescribeFrame ./approval"
  "FuzzIDScanner ./server"
  "FuzzParseMessage ./runtime/monitor"
)
for t in "${targets[@]}"; do
  read -r name pkg <<<"$t"
  echo "-- $name ($pkg, $budget)" >&2
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$budget" "$pkg"
done
