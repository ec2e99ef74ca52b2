# shellcheck shell=bash
# Shared settings and helpers of scripts/cluster.sh. Sourced; REPO is the repository root.
#
# Layout (every path the cluster uses on this machine is under CACHE or STATE, except the
# host paths listed in host.sh, which `up` records and `down` restores):
#   CACHE/kube-<version>-<src>/  the upstream components (one multi-call binary + symlinks)
#   CACHE/tools-<versions>-<src>/ helm and CoreDNS
#   CACHE/apt, CACHE/debs        a private apt configuration and the .deb files it fetched
#   CACHE/root                   the Debian packages unpacked (containerd, runc, CNI, etcd, iptables)
#   CACHE/images/*.tar           OCI archives loaded into containerd at every `up`
#   STATE/                       one running cluster: pki, configs, etcd data, containerd,
#                                kubelet root, logs, pids, what the host looked like before

CLUSTER_SRC="$REPO/scripts/cluster"
CACHE="${TIDEGATE_CLUSTER_CACHE:-$HOME/.cache/tidegate/cluster}"
STATE="${TIDEGATE_CLUSTER_STATE:-$CACHE/run}"

# Versions: one definition each, in the Go modules that build them.
K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$CLUSTER_SRC/kube/go.mod")
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ {print $2; exit}' "$CLUSTER_SRC/tools/go.mod")
COREDNS_VERSION=$(awk '($1 == "require" && $2 == "github.com/coredns/coredns") {print $3; exit}
    $1 == "github.com/coredns/coredns" && $2 ~ /^v/ {print $2; exit}' "$CLUSTER_SRC/tools/go.mod")

# Network: the node's pods, the Services, the cluster domain.
NODE_NAME="${TIDEGATE_CLUSTER_NODE:-tidegate-node}"
POD_CIDR=10.244.0.0/16
# The node's share of POD_CIDR (one node: host-local hands out addresses from it).
NODE_POD_SUBNET=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
BRIDGE=tidegate0
APISERVER_PORT="${TIDEGATE_CLUSTER_APISERVER_PORT:-6443}"
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
# The host folder the example PersistentVolumes serve models from (examples/cluster/).
MODELS_DIR=/var/lib/tidegate/models
# The cluster DNS image (scripts/cluster/tools/coredns), built here too.
COREDNS_IMAGE=tidegate.local/coredns:${COREDNS_VERSION:-unknown}
# The sandbox image every pod starts from: scripts/cluster/images/pause.c, built here.
PAUSE_IMAGE=tidegate.local/pause:1.0

DEB_ROOT="$CACHE/root"
WRAP_BIN="$CACHE/wrap/bin"
CNI_BIN="$DEB_ROOT/usr/lib/cni"
CONTAINERD_SOCK="$STATE/containerd/containerd.sock"
KUBECONFIG_ADMIN="$STATE/admin.kubeconfig"

# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

log() { printf '[cluster] %s\n' "$*" >&2; }
die() {
    printf '[cluster] ERROR: %s\n' "$*" >&2
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (the kubelet, containerd and the pod network do)"
}

# kube_dir: where the multi-call binary for this version and source lives.
kube_dir() {
    local src
    src=$(cat "$CLUSTER_SRC"/kube/*.go "$CLUSTER_SRC/kube/go.sum" | sha256sum | cut -c1-12)
    printf '%s/kube-%s-%s' "$CACHE" "$K8S_VERSION" "$src"
}
# tools_dir: helm and coredns, built from one module (scripts/cluster/tools: they share
# client-go), keyed by their versions and the module's sources.
tools_dir() {
    local src
    src=$(cat "$CLUSTER_SRC"/tools/coredns/*.go "$CLUSTER_SRC/tools/go.sum" | sha256sum | cut -c1-12)
    printf '%s/tools-helm-%s-coredns-%s-%s' "$CACHE" "$HELM_VERSION" "$COREDNS_VERSION" "$src"
}

# The tools a user of the cluster runs: kubectl and helm, first on PATH after `env`.
tools_bin() { printf '%s/bin' "$CACHE"; }

kubectl_admin() { "$(kube_dir)/bin/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# The node's address: the source address of the default route, else the first global IPv4.
node_ip() {
    local ip
    ip=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}')
    [ -n "$ip" ] || ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4; exit}')
    [ -n "$ip" ] || die "no global IPv4 address on this machine for the node (the API server advertises it to pods)"
    printf '%s' "$ip"
}

# wait_until SECONDS WHAT CMD...: polls CMD every half second; dies naming WHAT on timeout.
wait_until() {
    local secs=$1 what=$2
    shift 2
    local t0=$SECONDS
    until "$@" >/dev/null 2>&1; do
        if [ $((SECONDS - t0)) -ge "$secs" ]; then
            die "$what did not happen within ${secs}s (logs: $STATE/logs/)"
        fi
        sleep 0.5
    done
}

[ -n "$K8S_VERSION" ] || die "cannot read the Kubernetes version from $CLUSTER_SRC/kube/go.mod"
[ -n "$HELM_VERSION" ] || die "cannot read the helm version from $CLUSTER_SRC/tools/go.mod"
[ -n "$COREDNS_VERSION" ] || die "cannot read the CoreDNS version from $CLUSTER_SRC/tools/go.mod"
