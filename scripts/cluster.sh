#!/usr/bin/env bash
# cluster.sh up|down|status|kubeconfig|image AIRLOCK_BIN: a real single-node Kubernetes
# cluster on this host for the Kubernetes backend's tests: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet,
# over a containerd of its own (CRI plugin; not airlock's embedded one)
# whose `runsc` handler is the gVisor shim, published as RuntimeClass
# `gvisor`. Built by scripts/install-k8s.sh; nothing is pulled.
#
# Everything stays on this machine: the API server listens on the node
# address, a bridge of its own (10.217.0.1); pods get 10.217.0.0/24 with no
# masquerade and no default route (only the pod, service and link-local
# ranges, to the node), a firewall table drops anything they send off the bridge, and
# services (10.217.16.0/24) are routed to the bridge and proxied by
# kube-proxy (nftables mode, its node ports only on the bridge address), so
# no service address ever leaves the machine. gVisor runs sandbox pods with
# network "none": loopback only. kube-router's NetworkPolicy controller
# (nothing else of it: no routing, service proxy, CNI or BGP) enforces
# NetworkPolicy with iptables and ipset in the host's filter table.
#
# `up` is idempotent: a healthy cluster is left as it is. `down` stops it
# and removes its pods, mounts, network and state.
set -euo pipefail
command -v go >/dev/null || export PATH="/usr/local/go/bin:$PATH"

K8S_DIR="${AIRLOCK_K8S_DIR:-/usr/local/lib/airlock/k8s}"
BIN="$K8S_DIR/bin"
STATE="${AIRLOCK_CLUSTER_STATE:-/var/lib/airlock-k8s}"
RUN="${AIRLOCK_CLUSTER_RUN:-/run/airlock-k8s}"
LOGS="$STATE/logs"
PKI="$STATE/pki"
NODE=airlock-node
BRIDGE=airlockk8s0
NODE_IP=10.217.0.1
BRIDGE_MAC=02:a1:7c:6b:00:01 # locally administered
POD_CIDR=10.217.0.0/24
SERVICE_CIDR=10.217.16.0/24
API_PORT=16443
ETCD_CLIENT=127.0.0.1:23790
ETCD_PEER=127.0.0.1:23800
KUBELET_PORT=10350
NFT_TABLE=airlock_k8s
CTRD_SOCK="$RUN/containerd.sock"
MNTNS="$RUN/mntns"
PAUSE_IMAGE=registry.k8s.io/pause:3.10
KUBECONFIG_ADMIN="$STATE/admin.conf"
# Runtime monitoring's socket and trace session config (the agent's).
MONITOR_DIR="$RUN/monitor"

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root"

kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
in_ns() { nsenter --mount="$MNTNS" -- "$@"; }

pid_alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

# start NAME [--ns] CMD...: a daemon, its log in $LOGS/NAME.log.
start() {
  local name=$1; shift
  local ns=0
  if [[ $1 == --ns ]]; then ns=1; shift; fi
  if pid_alive "$name"; then return; fi
  log "starting $name"
  if ((ns)); then
    setsid nsenter --mount="$MNTNS" -- "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  else
    setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  fi
  echo $! >"$RUN/$name.pid"
}

stop() {
  local name=$1
  if pid_alive "$name"; then
    local pid
    pid=$(cat "$RUN/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/$name.pid"
}

# wait_for WHAT DAEMON SECONDS CMD...: until CMD succeeds; fails at once
# when DAEMON (a name given to start) has exited.
wait_for() {
  local what=$1 daemon=$2 secs=$3; shift 3
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ! pid_alive "$daemon" || ((SECONDS >= end)); then
      log "$what not ready (after $((secs - end + SECONDS))s; $daemon $(pid_alive "$daemon" && echo running || echo exited)); its last log lines:"
      tail -n 40 "$LOGS/$daemon.log" >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

healthy() {
  [[ -f "$KUBECONFIG_ADMIN" ]] || return 1
  pid_alive kube-proxy || return 1
  pid_alive kube-router || return 1
  kubectl get --raw /readyz >/dev/null 2>&1 || return 1
  [[ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]] || return 1
  kubectl get runtimeclass gvisor gvisor-net gvisor-monitor gvisor-net-monitor >/dev/null 2>&1
}

network_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  # A fixed MAC: a bridge left to itself takes the lowest MAC of its ports,
  # so it changed whenever a pod came or went, and pods that had cached the
  # node's old MAC sent into the void until their neighbour entry expired
  # (10 to 30 s of lost connections to the egress proxy). The bridge
  # plugin pins it only when it adds the gateway address, which is
  # already here.
  ip link set "$BRIDGE" address "$BRIDGE_MAC"
  ip addr replace "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Service addresses go to the bridge, never to the host's default route,
  # even before kube-proxy has rewritten them.
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
  # Pods talk to the node and each other, and to nothing else.
  nft -f - <<EOF
table inet $NFT_TABLE
delete table inet $NFT_TABLE
table inet $NFT_TABLE {
  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "$BRIDGE" oifname != "$BRIDGE" drop
    oifname "$BRIDGE" iifname != "$BRIDGE" drop
  }
}
EOF
  mkdir -p "$STATE/cni"
  # Pods route the pod and service ranges to the node, and link-local
  # (where a cloud puts its metadata service) too, as a cloud's pod network
  # would: the forward table above drops it at the node unless a test has
  # routed a stand-in address into a namespace of its own on the bridge,
  # so that the test can show the NetworkPolicy is what stops it.
  cat >"$STATE/cni/10-airlock.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "airlock-k8s",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "$POD_CIDR"}, {"dst": "$SERVICE_CIDR"}, {"dst": "169.254.0.0/16"}], "dataDir": "$STATE/cni-ipam"}},
    {"type": "loopback"}
  ]
}
EOF
}

pki_up() {
  [[ -f "$PKI/ca.crt" && -f "$STATE/admin.conf" && -f "$STATE/kubelet.conf" ]] && return
  log "minting certificates and kubeconfigs (kubeadm init phase, offline)"
  mkdir -p "$PKI"
  cat >"$STATE/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: $NODE_IP
  bindPort: $API_PORT
nodeRegistration:
  name: $NODE
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $("$BIN/kube-apiserver" --version | awk '{print $2}')
certificatesDir: $PKI
controlPlaneEndpoint: $NODE_IP:$API_PORT
networking:
  serviceSubnet: $SERVICE_CIDR
  podSubnet: $POD_CIDR
  dnsDomain: cluster.local
apiServer:
  certSANs: [127.0.0.1, $NODE_IP, localhost]
EOF
  "$BIN/kubeadm" init phase certs all --config "$STATE/kubeadm.yaml" >/dev/null
  "$BIN/kubeadm" init phase kubeconfig all --config "$STATE/kubeadm.yaml" --kubeconfig-dir "$STATE" >/dev/null
}

containerd_up() {
  mkdir -p "$STATE/containerd" "$RUN/containerd" "$STATE/runsc"
  # The gVisor shim reads its options from here: runsc with no network
  # (handler runsc, RuntimeClass gvisor), and runsc with its own network
  # stack on the pod's interface (handler runsc-net, RuntimeClass
  # gvisor-net), for the NetworkPolicy tests and networked sandboxes.
  # The same two again report to runtime monitoring (handlers
  # runsc-monitor and runsc-net-monitor, RuntimeClasses gvisor-monitor and
  # gvisor-net-monitor): their runsc reads the trace session that
  # `airlock monitor-agent --pod-init-config` writes, and connects to the
  # agent's socket; with no agent, their pods do not start.
  local net
  for net in none sandbox; do
    cat >"$STATE/runsc-$net.toml" <<EOF
binary_name = "/usr/local/bin/runsc"
root = "$RUN/runsc"
[runsc_config]
  network = "$net"
EOF
    cat >"$STATE/runsc-$net-monitor.toml" <<EOF
binary_name = "/usr/local/bin/runsc"
root = "$RUN/runsc"
[runsc_config]
  network = "$net"
  pod-init-config = "$MONITOR_DIR/pod-init.json"
EOF
  done
  mkdir -p "$MONITOR_DIR"
  chmod 700 "$MONITOR_DIR"
  local conf="$STATE/containerd.toml"
  cat >"$conf.new" <<EOF
version = 3
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$STATE/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "$BIN/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc-none.toml"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-net]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "$BIN/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-net.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc-sandbox.toml"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-monitor]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "$BIN/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-monitor.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc-none-monitor.toml"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-net-monitor]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "$BIN/containerd-shim-runsc-v1"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc-net-monitor.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc-sandbox-monitor.toml"
EOF
  # A containerd started with another configuration (an older script's)
  # is restarted with this one.
  if [[ -f "$conf" ]] && ! cmp -s "$conf" "$conf.new"; then stop containerd; fi
  mv "$conf.new" "$conf"
  start containerd --ns /usr/local/bin/containerd --config "$STATE/containerd.toml"
  wait_for "containerd (CRI)" containerd 30 in_ns /usr/local/bin/ctr --address "$CTRD_SOCK" version
}

# The pause image and the sandbox image, imported into namespace k8s.io.
images_up() {
  local ctr=(/usr/local/bin/ctr --address "$CTRD_SOCK" -n k8s.io)
  if ! in_ns "${ctr[@]}" images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete; then
    log "importing $PAUSE_IMAGE (pause.c from the kubernetes module)"
    local d
    d=$(mktemp -d)
    (cd "$(dirname "$0")/.." && go run ./scripts/k8s/pauseimage "$BIN/pause" "$PAUSE_IMAGE" "$d/pause.tar")
    in_ns "${ctr[@]}" images import --no-unpack=false "$d/pause.tar" >/dev/null
    rm -rf "$d"
  fi
}

control_plane_up() {
  mkdir -p "$STATE/etcd"
  start etcd "$BIN/etcd" --name airlock --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
    --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
    --initial-cluster "airlock=http://$ETCD_PEER" --listen-metrics-urls "" --log-level warn
  start kube-apiserver "$BIN/kube-apiserver" \
    --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$API_PORT" \
    --etcd-servers "http://$ETCD_CLIENT" --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=false --profiling=false
  wait_for kube-apiserver kube-apiserver 120 "$BIN/kubectl" --kubeconfig "$STATE/super-admin.conf" get --raw /readyz
  # kubeadm's admin.conf is in group kubeadm:cluster-admins, bound to
  # cluster-admin by `kubeadm init` itself, which this cluster never runs.
  "$BIN/kubectl" --kubeconfig "$STATE/super-admin.conf" create clusterrolebinding kubeadm:cluster-admins \
    --clusterrole=cluster-admin --group=kubeadm:cluster-admins --dry-run=client -o yaml |
    "$BIN/kubectl" --kubeconfig "$STATE/super-admin.conf" apply -f - >/dev/null
  # And the API server's client to the kubelet (exec, attach, logs) may use
  # the kubelet's API, as kubeadm init would have bound it.
  "$BIN/kubectl" --kubeconfig "$STATE/super-admin.conf" create clusterrolebinding kubeadm:kubelet-api-admin \
    --clusterrole=system:kubelet-api-admin --user=kube-apiserver-kubelet-client --dry-run=client -o yaml |
    "$BIN/kubectl" --kubeconfig "$STATE/super-admin.conf" apply -f - >/dev/null
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.conf" --authentication-kubeconfig "$STATE/controller-manager.conf" \
    --authorization-kubeconfig "$STATE/controller-manager.conf" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --use-service-account-credentials --leader-elect=false --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$STATE/scheduler.conf" \
    --authentication-kubeconfig "$STATE/scheduler.conf" --authorization-kubeconfig "$STATE/scheduler.conf" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --profiling=false
}

kubelet_up() {
  mkdir -p "$STATE/kubelet"
  # The kubelet's cgroup root must exist in every hierarchy before it starts.
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -f "$h/cgroup.procs" ]] && mkdir -p "$h/airlock-k8s"
  done
  # A new cpuset cgroup starts with no CPUs or memory nodes: give it all.
  if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/airlock-k8s/cpuset.cpus
    cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/airlock-k8s/cpuset.mems
  fi
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /airlock-k8s
# These VMs are cgroup v1 (hybrid); 1.37 runs there only when told to.
failCgroupV1: false
podLogsDir: $STATE/pod-logs
volumePluginDir: $STATE/volume-plugins
containerRuntimeEndpoint: unix://$CTRD_SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
failSwapOn: false
# Leave the host's iptables alone as far as the kubelet lets us (down
# removes the canary chains it makes regardless).
makeIPTablesUtilChains: false
resolvConf: ""
podPidsLimit: 4096
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  start kubelet --ns "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.conf" \
    --root-dir "$STATE/kubelet" --hostname-override "$NODE" --node-ip "$NODE_IP" --cert-dir "$STATE/kubelet/pki"
  wait_for "node $NODE Ready" kubelet 180 sh -c "[ \"\$('$BIN/kubectl' --kubeconfig '$KUBECONFIG_ADMIN' get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"
}

proxy_up() {
  # masqueradeAll: a pod's reply to a service client on the same bridge
  # would otherwise skip the host and its conntrack. conntrack sysctls are
  # left alone (maxPerCore 0 and no timeouts): these VMs may refuse them.
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: $KUBECONFIG_ADMIN}
hostnameOverride: $NODE
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
masqueradeAll: true
nodePortAddresses: ["$NODE_IP/32"]
healthzBindAddress: ""
metricsBindAddress: ""
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
  wait_for "kube-proxy's nftables table" kube-proxy 60 nft list table ip kube-proxy
}

# netpol_up: kube-router as the NetworkPolicy enforcer. Its chains hang
# off INPUT, FORWARD and OUTPUT and match pod addresses only; pods on the
# bridge pass through them because bridged traffic is sent to iptables
# (bridge-nf-call-iptables, which the kernel here has on).
netpol_up() {
  [[ -x "$BIN/kube-router" ]] || die "no kube-router in $BIN: run scripts/install-k8s.sh"
  command -v ipset >/dev/null || die "no ipset: run scripts/install-k8s.sh"
  start kube-router "$BIN/kube-router" --kubeconfig "$KUBECONFIG_ADMIN" --hostname-override "$NODE" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --enable-pod-egress=false --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0
  wait_for "kube-router's chains" kube-router 60 iptables -S KUBE-ROUTER-FORWARD
}

objects_up() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor-net
handler: runsc-net
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor-monitor
handler: runsc-monitor
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor-net-monitor
handler: runsc-net-monitor
EOF
}

mntns_up() {
  mkdir -p "$RUN" "$LOGS"
  if [[ -f "$MNTNS" ]] && nsenter --mount="$MNTNS" true 2>/dev/null; then return; fi
  # A mount namespace of the cluster's own, its mounts shared within it
  # (kubelet wants propagation) and private to the host: pod volumes never
  # appear in the host's mount table. Bound to a file, it needs no process.
  if ! grep -q " $RUN " /proc/self/mountinfo; then
    mount --bind "$RUN" "$RUN"
    mount --make-private "$RUN"
  fi
  touch "$MNTNS"
  unshare --mount="$MNTNS" --propagation shared true
}

up() {
  [[ -x "$BIN/kubelet" ]] || die "no kubernetes binaries in $BIN: run scripts/install-k8s.sh"
  if healthy; then log "cluster healthy (kubeconfig $KUBECONFIG_ADMIN)"; return; fi
  mkdir -p "$STATE" "$RUN" "$LOGS"
  mntns_up
  network_up
  pki_up
  containerd_up
  images_up
  control_plane_up
  kubelet_up
  proxy_up
  netpol_up
  objects_up
  log "cluster up: KUBECONFIG=$KUBECONFIG_ADMIN"
}

# The kubelet's KUBE-* iptables chains (and the jumps to them), which it
# makes on any host it runs on. Only a kubelet makes them; none other runs
# on a machine that runs this cluster.
iptables_clean() {
  local ipt t
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
      "$ipt-save" -t "$t" 2>/dev/null | { grep -E '^-A [A-Z]+ .*-j KUBE-' || true; } | sed 's/^-A/-D/' | while read -r rule; do
        # eval: the rule's comments are quoted as a shell would quote them
        # (kube-router's have spaces); the text is the kernel's ruleset.
        eval "\"\$ipt\" -t \"\$t\" $rule" 2>/dev/null || true
      done
      "$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(KUBE-[A-Z0-9-]*\) .*/\1/p' | while read -r chain; do
        "$ipt" -t "$t" -F "$chain" 2>/dev/null || true
      done
      "$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(KUBE-[A-Z0-9-]*\) .*/\1/p' | while read -r chain; do
        "$ipt" -t "$t" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

# kube-router's ipsets (KUBE-SRC-*, KUBE-DST-*, ...), once no rule
# refers to them (iptables_clean first).
ipsets_clean() {
  command -v ipset >/dev/null || return 0
  ipset list -n 2>/dev/null | { grep -E '^(inet6:)?KUBE-' || true; } | while read -r set; do
    ipset destroy "$set" 2>/dev/null || true
  done
}

down() {
  if [[ -f "$KUBECONFIG_ADMIN" ]] && pid_alive kube-apiserver; then
    kubectl delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  fi
  for c in kube-router kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done
  if pid_alive containerd; then
    # Pod sandboxes go with their shims.
    in_ns /usr/local/bin/ctr --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null | while read -r t; do
      in_ns /usr/local/bin/ctr --address "$CTRD_SOCK" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1 || true
    done
  fi
  stop containerd
  pkill -9 -f "containerd-shim-runsc-v1.*-address $CTRD_SOCK" 2>/dev/null || true
  pkill -9 -f "runsc.*--root=$RUN/runsc" 2>/dev/null || true
  if [[ -f "$MNTNS" ]]; then umount "$MNTNS" 2>/dev/null || true; rm -f "$MNTNS"; fi
  if grep -q " $RUN " /proc/self/mountinfo; then umount -l "$RUN" || true; fi
  nft delete table inet "$NFT_TABLE" 2>/dev/null || true
  nft delete table ip kube-proxy 2>/dev/null || true
  nft delete table ip6 kube-proxy 2>/dev/null || true
  iptables_clean
  ipsets_clean
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$RUN" "$STATE"
  cgroups_clean || die "cgroups under /sys/fs/cgroup/*/airlock-k8s still hold processes"
  log "cluster down"
}

# The kubelet's cgroup tree. The processes killed above leave their cgroups
# only once they have exited, so this waits (bounded) for each to empty.
cgroups_clean() {
  local deadline=$((SECONDS + 30)) d left
  while :; do
    left=0
    for d in /sys/fs/cgroup/*/airlock-k8s; do
      [[ -d $d ]] || continue
      find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [[ -d $d ]] && left=1
    done
    ((left)) || return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

# image AIRLOCK_BIN: airlock's sandbox image, built (or taken from airlock's
# build cache) and imported into the cluster's containerd, namespace k8s.io.
image() {
  [[ -x "${1:-}" ]] || die "usage: $0 image PATH_TO_AIRLOCK"
  healthy || die "the cluster is not up"
  AIRLOCK_CONTAINERD_ADDRESS="$CTRD_SOCK" AIRLOCK_CONTAINERD_NAMESPACE=k8s.io "$1" image build --log-level warn >&2
  # airlock's own image, for the deploy/kubernetes Deployment.
  AIRLOCK_CONTAINERD_ADDRESS="$CTRD_SOCK" AIRLOCK_CONTAINERD_NAMESPACE=k8s.io "$1" image server --binary "$1" --log-level warn >&2
}

case "${1:-}" in
  up) up ;;
  image) image "${2:-}" ;;
  down) down ;;
  status) if healthy; then log "healthy"; else log "not running"; exit 1; fi ;;
  kubeconfig) echo "$KUBECONFIG_ADMIN" ;;
  *) die "usage: $0 up|down|status|kubeconfig|image AIRLOCK_BIN" ;;
esac
