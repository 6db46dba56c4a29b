# The README's two commands are `sudo make serve` and `sudo make test`.
.PHONY: serve test build unit deps image bench bench-claims fuzz

serve:
	@bash scripts/serve.sh

test:
	@bash scripts/test.sh

deps:
	@bash scripts/install-deps.sh

build:
	@bash scripts/build.sh

image: build
	./bin/airlock image build

# Unit tests only: no containerd needed.
unit:
	go test -short ./config ./tools ./server

# The benchmark (about 50 minutes on 2 cores): bench-results/*.md, .json, .png.
bench:
	@bash scripts/bench.sh

# Warm-pod claims on the test cluster's API server with kwok's fake nodes
# (about 3 minutes once the cluster's binaries are built): bench-results/.
bench-claims:
	@bash scripts/bench-claims.sh

# Every fuzz target for FUZZ_BUDGET executions or time each (default 50000x).
fuzz:
	@bash scripts/fuzz.sh
