#!/usr/bin/env bash
# bench-claims.sh: the warm-pod claim benchmark (`airlock bench claims`) on
# the test cluster, after installing what is missing (the cluster's
# binaries and kwok) and building: 50 fake nodes, a pool of 1000 ready
# pods, two replicas claiming at rising rates. Results go to
# bench-results/ (Markdown, JSON); extra arguments pass on. The cluster is
# started when it is not running and left as it was found.
set -euo pipefail
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
K8S_BIN="${AIRLOCK_K8S_DIR:-/usr/local/lib/airlock/k8s}/bin"
{
  bash scripts/install-deps.sh
  bash scripts/install-k8s.sh
  bash scripts/build.sh
} 1>&2
if ! bash scripts/cluster.sh status 2>/dev/null; then
  trap 'bash scripts/cluster.sh down' EXIT
  bash scripts/cluster.sh up 1>&2
fi
./bin/airlock bench claims --log-level warn --kwok "$K8S_BIN/kwok" --kubeconfig "$(bash scripts/cluster.sh kubeconfig)" "$@"
