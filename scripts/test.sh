#!/usr/bin/env bash
# test.sh: the one command that runs every test on a fresh host. It installs
# what is missing, builds, checks formatting and lints, builds the image, then
# starts a single-node Kubernetes cluster (scripts/cluster.sh), then runs the
# Go tests (real containerd + runsc, real cluster) and the end-to-end suite
# (the official TypeScript MCP SDK client driving bin/airlock over stdio).
# Under CI=true a missing prerequisite is a failure, never a skip.
set -euo pipefail
# Go lives in /usr/local/go on these hosts; a login shell may not have it on PATH.
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"
cd "$(dirname "$0")/.."
export CI="${CI:-false}"
STATICCHECK_VERSION=v0.8.2

step() { echo "== $*" >&2; }

step "install dependencies"
bash scripts/install-deps.sh
bash scripts/install-test-deps.sh

step "build"
bash scripts/build.sh

step "gofmt, go vet, staticcheck"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n "$unformatted" ]]; then
  echo "gofmt needed on: $unformatted" >&2
  exit 1
fi
go vet ./...
if ! command -v staticcheck >/dev/null || [[ "$(staticcheck -version 2>/dev/null)" != *"(${STATICCHECK_VERSION#v})"* ]]; then
  GOBIN=/usr/local/bin go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
staticcheck ./...

step "eslint on the end-to-end files (a name never defined fails here, not 30 minutes in)"
(cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error && npx --no-install eslint .)

step "sandbox image"
./bin/airlock image build

step "kubernetes test cluster (binaries built once per machine: ~10 min cold)"
bash scripts/install-k8s.sh
# Down again when the tests end, pass or fail, unless asked to keep it.
if [[ "${AIRLOCK_KEEP_CLUSTER:-0}" != 1 ]]; then
  trap 'bash scripts/cluster.sh down' EXIT
fi
bash scripts/cluster.sh up
bash scripts/cluster.sh image ./bin/airlock

step "go test"
# One package at a time: they share the embedded containerd, the image and
# the host firewall, and backend/local kills and restarts containerd.
go test -p 1 -count=1 -timeout 30m ./...

step "fuzz targets (a short run each; the seed corpora also replay in go test)"
bash scripts/fuzz.sh

step "benchmark smoke (every mode works; numbers not asserted)"
./bin/airlock bench --smoke --kubeconfig "$(bash scripts/cluster.sh kubeconfig)" --log-level warn --out "$(mktemp -d)" >/dev/null

step "claim benchmark smoke (kwok's fake nodes: no pod claimed twice, nothing left behind)"
./bin/airlock bench claims --smoke --kwok "${AIRLOCK_K8S_DIR:-/usr/local/lib/airlock/k8s}/bin/kwok" \
  --kubeconfig "$(bash scripts/cluster.sh kubeconfig)" --log-level warn --out "$(mktemp -d)" >/dev/null

step "end-to-end (TypeScript MCP SDK over stdio; approval console in Chromium)"
(cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error && AIRLOCK_BIN="$PWD/../../bin/airlock" node --test --test-concurrency=1)

step "all tests passed"
