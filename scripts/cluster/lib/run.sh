# shellcheck shell=bash
# Starting and stopping the cluster's processes. Each runs in its own session (setsid) with
# its log in STATE/logs and its pid in STATE/pids; `down` ends exactly those pids, after
# checking that each is still the program it started.

PIDS="$STATE/pids"
LOGS="$STATE/logs"

# start_component NAME CMD...: starts CMD in the background as NAME.
start_component() {
    local name=$1
    shift
    mkdir -p "$PIDS" "$LOGS"
    if component_running "$name"; then
        log "$name already runs (pid $(cat "$PIDS/$name.pid"))"
        return 0
    fi
    # The program that the pid ends up running: CMD past `env` and its assignments.
    local exe="" a
    for a in "$@"; do
        case $a in env | *=*) continue ;; *) exe=$a && break ;; esac
    done
    setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
    printf '%s\n' "$!" >"$PIDS/$name.pid"
    printf '%s\n' "$exe" >"$PIDS/$name.exe"
}

# component_running NAME: its recorded pid is alive and still runs the program it started.
component_running() {
    local name=$1 pid exe
    [ -f "$PIDS/$name.pid" ] || return 1
    pid=$(cat "$PIDS/$name.pid")
    exe=$(cat "$PIDS/$name.exe" 2>/dev/null) || return 1
    [ -d "/proc/$pid" ] || return 1
    # The first word of the command line is what start_component ran.
    [ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n1)" = "$exe" ]
}

# stop_component NAME [GRACE]: SIGTERM, then SIGKILL after GRACE seconds (default 20).
stop_component() {
    local name=$1 grace=${2:-20} pid t
    if ! component_running "$name"; then
        rm -f "$PIDS/$name.pid" "$PIDS/$name.exe"
        return 0
    fi
    pid=$(cat "$PIDS/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for ((t = 0; t < grace * 10; t++)); do
        [ -d "/proc/$pid" ] || break
        sleep 0.1
    done
    if [ -d "/proc/$pid" ]; then
        log "$name (pid $pid) did not stop within ${grace}s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$PIDS/$name.pid" "$PIDS/$name.exe"
}

# Each component's command line.
start_etcd() {
    start_component etcd "$DEB_ROOT/usr/bin/etcd" --name "$NODE_NAME" --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "$NODE_NAME=http://127.0.0.1:$ETCD_PEER_PORT" \
        --unsafe-no-fsync --log-level warn
    wait_until 60 "etcd answering on 127.0.0.1:$ETCD_CLIENT_PORT" \
        curl -sf "http://127.0.0.1:$ETCD_CLIENT_PORT/health"
}

start_apiserver() {
    local ip=$1
    start_component kube-apiserver "$(kube_dir)/bin/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
        --advertise-address "$ip" --bind-address 0.0.0.0 --secure-port "$APISERVER_PORT" \
        --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
        --client-ca-file "$PKI/ca.crt" \
        --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$PKI/ca.crt" \
        --service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
        --service-account-key-file "$PKI/sa.pub" \
        --service-account-signing-key-file "$PKI/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --authorization-mode Node,RBAC \
        --kubelet-preferred-address-types InternalIP,Hostname \
        --enable-admission-plugins NodeRestriction \
        --allow-privileged=false --profiling=false --v=1
    wait_until 120 "kube-apiserver ready on :$APISERVER_PORT" \
        curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
        "https://127.0.0.1:$APISERVER_PORT/readyz"
}

start_controller_manager() {
    start_component kube-controller-manager "$(kube_dir)/bin/kube-controller-manager" \
        --kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
        --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
        --use-service-account-credentials --leader-elect=false \
        --bind-address 127.0.0.1 --profiling=false --v=1
}

start_scheduler() {
    start_component kube-scheduler "$(kube_dir)/bin/kube-scheduler" \
        --kubeconfig "$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
        --leader-elect=false --bind-address 127.0.0.1 --profiling=false --v=1
}

start_containerd() {
    # PATH: containerd finds the shim, the shim finds runc (by the configured BinaryName),
    # the CNI plugins find iptables.
    start_component containerd env PATH="$WRAP_BIN:$DEB_ROOT/usr/bin:$PATH" \
        "$DEB_ROOT/usr/bin/containerd" --config "$STATE/containerd/config.toml"
    wait_until 60 "containerd answering on $CONTAINERD_SOCK" \
        "$DEB_ROOT/usr/bin/ctr" --address "$CONTAINERD_SOCK" version
}

start_kubelet() {
    local ip=$1
    start_component kubelet env PATH="$WRAP_BIN:$PATH" "$(kube_dir)/bin/kubelet" \
        --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
        --root-dir "$STATE/kubelet" --hostname-override "$NODE_NAME" --node-ip "$ip" --v=1
}

start_kube_proxy() {
    start_component kube-proxy env PATH="$WRAP_BIN:$PATH" "$(kube_dir)/bin/kube-proxy" \
        --config "$STATE/kube-proxy.yaml" --v=1
}

# load_image FILE: an OCI archive into the k8s.io namespace, where the kubelet looks.
load_image() {
    "$DEB_ROOT/usr/bin/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images import \
        --local "$1" >/dev/null
}

# tag_image IMAGE NAME: another name for a loaded image (both fully qualified).
tag_image() {
    "$DEB_ROOT/usr/bin/ctr" --address "$CONTAINERD_SOCK" -n k8s.io images tag --force "$1" "$2" >/dev/null
}

# qualified_image NAME: the name as containerd stores it (docker.io/library/ for a bare one).
qualified_image() {
    case $1 in
        *.*/* | *:*/* | localhost/*) printf '%s' "$1" ;;
        */*) printf 'docker.io/%s' "$1" ;;
        *) printf 'docker.io/library/%s' "$1" ;;
    esac
}

node_ready() {
    [ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# start_dns: CoreDNS in kube-system behind the kube-dns Service (the address every pod's
# resolv.conf names), from scripts/cluster/manifests/coredns.yaml.
start_dns() {
    sed -e "s|@IMAGE@|$COREDNS_IMAGE|; s|@CLUSTER_DOMAIN@|$CLUSTER_DOMAIN|; s|@DNS_SERVICE_IP@|$DNS_SERVICE_IP|" \
        "$CLUSTER_SRC/manifests/coredns.yaml" | kubectl_admin apply -f - >/dev/null \
        || die "applying the cluster DNS (CoreDNS) failed"
    wait_until 120 "the cluster DNS (CoreDNS) Ready" \
        kubectl_admin -n kube-system rollout status deployment/coredns --timeout=2s
}
