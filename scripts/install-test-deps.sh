#!/usr/bin/env bash
# install-test-deps.sh: what only the tests need, idempotently: Debian's
# Chromium for the approval console's browser test. (The Go and Node
# dependencies come from their registries in test.sh.)
set -euo pipefail
log() { echo "install-test-deps: $*" >&2; }
if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (it installs system packages)"
  exit 1
fi
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  log "chromium present"
else
  log "apt-get install chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
