#!/usr/bin/env bash
# install-k8s.sh: builds the Kubernetes test cluster's binaries from the Go
# module proxy, idempotently: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl, kubeadm and kube-proxy from
# k8s.io/kubernetes, etcd
# from go.etcd.io/etcd/server, the pause container from pause.c in the
# kubernetes module, the gVisor shim for pods, and kwok (fake nodes, for
# the claim benchmark), helm, and kube-router (NetworkPolicy) with the
# ipset tool it calls. Nothing is pulled from a
# registry.
#
# k8s.io/kubernetes cannot be built with `go install`: its go.mod replaces
# its 33 staging modules with ./staging paths the module zip lacks. A
# wrapper module requires it and replaces each staging module with its
# published v0.X.Y twin instead (ENVIRONMENT.md). A cold build takes about
# 8 minutes on 2 cores; each part is stamped with its version under
# $K8S_DIR, and a second run does nothing.
set -euo pipefail
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"

KUBE_VERSION="v1.37.2"
STAGING_VERSION="v0.37.2"
ETCD_VERSION="v3.6.17"
# kwok: fake nodes and pods for the claim benchmark (`airlock bench claims`).
KWOK_VERSION="v0.8.0"
# helm: renders and lints deploy/helm/airlock in backend/kube's tests.
HELM_VERSION="v4.3.2"
# kube-router: only its NetworkPolicy controller (iptables + ipset), the
# test cluster's enforcer; kube-network-policies needs nft queue, which
# this kernel lacks. v2.1.0 is the one version on the module proxy (it
# flags reported flaws in it): it runs with its router, service proxy, CNI
# and BGP off, on a cluster that never leaves this machine.
KUBE_ROUTER_VERSION="v2.1.0"
# The gVisor shim of install-deps.sh (its pin), built again with one change.
GVISOR_VERSION=$(sed -n 's/^GVISOR_VERSION="\(.*\)"$/\1/p' "$(dirname "$0")/install-deps.sh")
K8S_DIR="${AIRLOCK_K8S_DIR:-/usr/local/lib/airlock/k8s}"
BIN="$K8S_DIR/bin"
STAMPS="$K8S_DIR/stamps"

log() { echo "install-k8s: $*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (it installs into $K8S_DIR)"
  exit 1
fi
mkdir -p "$BIN" "$STAMPS"
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
gomod_go=$(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')

# done_part NAME VERSION BINARY...: the part is built at this version.
done_part() {
  local name=$1 version=$2; shift 2
  [[ -f "$STAMPS/$name" && "$(cat "$STAMPS/$name")" == "$version" ]] || return 1
  local b
  for b in "$@"; do [[ -x "$BIN/$b" ]] || return 1; done
}
mark() { echo "$2" >"$STAMPS/$1"; }

# 1. Kubernetes.
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kubeadm)
# kube-proxy is a part of its own: added later, it must not rebuild the rest.
PROXY_BINARIES=(kube-proxy)
kube_dir=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"

# kube_wrapper: the wrapper module in $work/kube, made once per run.
kube_wrapper() {
  [[ -f "$work/kube/go.sum" ]] && return
  # The kubernetes module's go.mod names the staging modules to replace.
  kube_mod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [[ -f "$kube_mod" && -d "$kube_dir" ]] || { log "could not download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
  staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kube_mod" | sort -u)
  [[ $(wc -l <<<"$staging") -ge 30 ]] || { log "found only $(wc -l <<<"$staging") staging modules in $kube_mod"; exit 1; }
  mkdir -p "$work/kube"
  {
    printf 'module airlock.local/k8sbuild\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\n' "$gomod_go" "$KUBE_VERSION"
    for m in $staging; do echo "replace $m => $m $STAGING_VERSION"; done
  } >"$work/kube/go.mod"
  {
    printf '//go:build tools\n\npackage k8sbuild\n\nimport (\n'
    for c in "${KUBE_BINARIES[@]}" "${PROXY_BINARIES[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    printf ')\n'
  } >"$work/kube/tools.go"
  log "resolving k8s.io/kubernetes $KUBE_VERSION ($(wc -l <<<"$staging") staging modules replaced by $STAGING_VERSION)"
  (cd "$work/kube" && GOFLAGS=-mod=mod go mod tidy)
}

# kube_build NAME...: builds the named commands of k8s.io/kubernetes.
kube_build() {
  kube_wrapper
  local c
  for c in "$@"; do
    log "building $c $KUBE_VERSION"
    (cd "$work/kube" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "$ldflags" -o "$BIN/$c.new" "k8s.io/kubernetes/cmd/$c")
    mv -f "$BIN/$c.new" "$BIN/$c"
  done
}

if done_part kube "$KUBE_VERSION" "${KUBE_BINARIES[@]}"; then
  log "kubernetes $KUBE_VERSION present"
else
  kube_build "${KUBE_BINARIES[@]}"
  mark kube "$KUBE_VERSION"
fi
if done_part kube-proxy "$KUBE_VERSION" "${PROXY_BINARIES[@]}"; then
  log "kube-proxy $KUBE_VERSION present"
else
  kube_build "${PROXY_BINARIES[@]}"
  mark kube-proxy "$KUBE_VERSION"
fi

# 2. etcd: its own wrapper (its server module's replace directives stop go install).
if done_part etcd "$ETCD_VERSION" etcd; then
  log "etcd $ETCD_VERSION present"
else
  mkdir -p "$work/etcd"
  printf 'module airlock.local/etcdbuild\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$gomod_go" "$ETCD_VERSION" >"$work/etcd/go.mod"
  printf '// Command etcd is etcd'"'"'s server, built from its module.\npackage main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >"$work/etcd/main.go"
  log "building etcd $ETCD_VERSION"
  (cd "$work/etcd" && GOFLAGS=-mod=mod go mod tidy >/dev/null && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.new" .)
  mv -f "$BIN/etcd.new" "$BIN/etcd"
  mark etcd "$ETCD_VERSION"
fi

# 3. The pause container: static, from the kubernetes module's own source.
if done_part pause "$KUBE_VERSION" pause; then
  log "pause $KUBE_VERSION present"
else
  if ! command -v gcc >/dev/null; then
    log "apt-get install gcc libc6-dev"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
  fi
  log "building pause from $kube_dir/build/pause/linux/pause.c"
  gcc -Os -static -o "$BIN/pause.new" -DVERSION="$KUBE_VERSION" "$kube_dir/build/pause/linux/pause.c"
  mv -f "$BIN/pause.new" "$BIN/pause"
  mark pause "$KUBE_VERSION"
fi

# 4. The gVisor shim, for pods (a pod is several containers in one sandbox,
# which runsc behind the runc shim reports wrongly). On these VMs its write
# of the shim's oom_score_adj fails (no CAP_SYS_RESOURCE) and start aborts.
# This build makes that one write best effort, printing nothing in its place
# (containerd parses start's stdout), from a copy of the module.
SHIM_STAMP="$GVISOR_VERSION+oom-best-effort"
if done_part shim "$SHIM_STAMP" containerd-shim-runsc-v1; then
  log "gVisor shim $GVISOR_VERSION present"
else
  gvisor_dir=$(go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  cp -r "$gvisor_dir" "$work/gvisor"
  chmod -R u+w "$work/gvisor"
  manager="$work/gvisor/pkg/shim/v1/manager.go"
  grep -q 'failed to set OOM Score on shim' "$manager" || { log "the OOM score write moved in $manager: update this patch"; exit 1; }
  sed -i 's|return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)|_ = err // airlock: best effort where the host forbids it|' "$manager"
  mkdir -p "$work/shim"
  printf 'module airlock.local/shimbuild\n\ngo %s\n\nrequire gvisor.dev/gvisor %s\n\nreplace gvisor.dev/gvisor => ../gvisor\n' "$gomod_go" "$GVISOR_VERSION" >"$work/shim/go.mod"
  printf '//go:build tools\n\npackage shimbuild\n\nimport _ "gvisor.dev/gvisor/shim"\n' >"$work/shim/tools.go"
  log "building containerd-shim-runsc-v1 (gVisor $GVISOR_VERSION, OOM score write best effort)"
  (cd "$work/shim" && GOFLAGS=-mod=mod go mod tidy >/dev/null && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -o "$BIN/containerd-shim-runsc-v1.new" gvisor.dev/gvisor/shim)
  mv -f "$BIN/containerd-shim-runsc-v1.new" "$BIN/containerd-shim-runsc-v1"
  mark shim "$SHIM_STAMP"
fi

# 5. kwok: `go install` works for it (about 3 minutes on 2 cores).
if done_part kwok "$KWOK_VERSION" kwok; then
  log "kwok $KWOK_VERSION present"
else
  log "building kwok $KWOK_VERSION"
  GOBIN="$work/kwokbin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv -f "$work/kwokbin/kwok" "$BIN/kwok"
  mark kwok "$KWOK_VERSION"
fi

# 6. helm: `go install` works for it too. Its version string is set at link
# time, as helm's own Makefile does, or `helm version` says only "v4.3".
if done_part helm "$HELM_VERSION" helm; then
  log "helm $HELM_VERSION present"
else
  log "building helm $HELM_VERSION"
  GOBIN="$work/helmbin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  mv -f "$work/helmbin/helm" "$BIN/helm"
  mark helm "$HELM_VERSION"
fi

# 7. kube-router, and Debian's ipset, which it runs.
if ! command -v ipset >/dev/null; then
  log "apt-get install ipset"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends ipset >/dev/null
fi
if done_part kube-router "$KUBE_ROUTER_VERSION" kube-router; then
  log "kube-router $KUBE_ROUTER_VERSION present"
else
  log "building kube-router $KUBE_ROUTER_VERSION"
  GOBIN="$work/krbin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
  mv -f "$work/krbin/kube-router" "$BIN/kube-router"
  mark kube-router "$KUBE_ROUTER_VERSION"
fi

log "ok: binaries in $BIN"
