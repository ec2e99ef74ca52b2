#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, to try tidegate on and to run its
# cluster e2e against: upstream kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kube-proxy built from k8s.io/kubernetes through the Go module proxy; etcd,
# containerd, runc, the CNI plugins and iptables from Debian packages unpacked into a cache;
# every image built locally (no registry is needed or used). Run as root.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LIB="$REPO/scripts/cluster/lib"
# shellcheck source=cluster/lib/common.sh
. "$LIB/common.sh"
# shellcheck source=cluster/lib/install.sh
. "$LIB/install.sh"
# shellcheck source=cluster/lib/pki.sh
. "$LIB/pki.sh"
# shellcheck source=cluster/lib/config.sh
. "$LIB/config.sh"
# shellcheck source=cluster/lib/host.sh
. "$LIB/host.sh"
# shellcheck source=cluster/lib/run.sh
. "$LIB/run.sh"
# shellcheck source=cluster/lib/images.sh
. "$LIB/images.sh"

usage() {
    cat <<EOF
Usage: scripts/cluster.sh COMMAND

A single-node Kubernetes $K8S_VERSION cluster on this machine (run as root).

Commands:
  up         build or fetch what is missing (cached, keyed by version), start the cluster and
             wait until its node is Ready; loads every image built by \`images\` before.
             State left by a cluster that ended without \`down\` is removed first
  down       stop the processes \`up\` started (by pid), remove every pod, and put back what
             the cluster changed on the host (mounts, the pod bridge, iptables rules,
             sysctls, cgroups, paths); then delete the cluster's state
  status     each component and the node; exit 0 only when all run and the node is Ready
  env        the exports for this cluster's kubectl and helm and its KUBECONFIG:
               eval "\$(scripts/cluster.sh env)"
  images     build the tidegate engine and operator images from this checkout (release
             binaries; TIDEGATE_IMAGE_PROFILE=debug for the dev profile) as docker/Dockerfile.*
             describe them, and load them into the cluster when it runs
  load FILE  load an OCI archive into the cluster's containerd
  tag IMAGE NEW_NAME
             give a loaded image another name (try a chart upgrade to a "new" operator
             image without a registry: scripts/cluster.sh tag REPO:V REPO:V-next)
  install    only build and fetch (cold: about 12 minutes on 2 cores), start nothing
  logs NAME  print a component's log: ${COMPONENTS[*]}
  host-snapshot
             print what the host looks like where the cluster touches it (processes, mounts,
             network devices, iptables, sysctls, paths, cgroups): equal before up and after down

Environment:
  TIDEGATE_CLUSTER_CACHE   builds and packages (default ~/.cache/tidegate/cluster)
  TIDEGATE_CLUSTER_STATE   the running cluster's files (default \$TIDEGATE_CLUSTER_CACHE/run)
  TIDEGATE_CLUSTER_APISERVER_PORT   the API server's port (default 6443)

Try tidegate on it: docs/operations.md, "Try it on a local cluster".
EOF
}

cmd_up() {
    need_root "up"
    if cluster_healthy; then
        log "the cluster is already up (node $NODE_NAME Ready)"
        return 0
    fi
    local t0=$SECONDS ip
    if [ -d "$STATE" ]; then
        # An earlier cluster ended without `down` (a killed session, a reboot): its etcd
        # still holds that run's pools and releases. Start from a clean cluster instead of
        # resuming a half-remembered one; `down` also puts the host back as that `up` found it.
        log "a cluster that is not running left its state at $STATE: removing it first"
        cmd_down
    fi
    cmd_install
    ip=$(node_ip)
    mkdir -p "$STATE"
    snapshot_host
    mkdir -p "$MODELS_DIR"
    chmod 755 "$MODELS_DIR" "$(dirname "$MODELS_DIR")"
    make_pki "$ip"
    write_containerd_config
    write_cni_config
    write_kubelet_config
    write_kube_proxy_config
    start_etcd
    start_apiserver "$ip"
    start_controller_manager
    start_scheduler
    start_containerd
    load_cached_images
    start_kubelet "$ip"
    start_kube_proxy
    wait_until 120 "node $NODE_NAME Ready" node_ready
    wait_until 60 "the default ServiceAccount" kubectl_admin get serviceaccount default -n default
    start_dns
    log "cluster up in $((SECONDS - t0))s: Kubernetes $K8S_VERSION, node $NODE_NAME ($ip)"
    log "use it: eval \"\$(scripts/cluster.sh env)\"; kubectl get nodes"
}

cmd_down() {
    need_root "down"
    if [ ! -d "$STATE" ]; then
        log "no cluster state at $STATE; nothing to do"
        return 0
    fi
    # The kubelet first, so that nothing restarts the pods removed next; then every pod
    # through the CRI (containers stopped, CNI DEL, network namespaces released).
    stop_component kube-controller-manager
    stop_component kube-scheduler
    stop_component kubelet
    if component_running containerd; then
        "$(kube_dir)/bin/cri-reset" --endpoint "unix://$CONTAINERD_SOCK" >>"$LOGS/cri-reset.log" 2>&1 \
            || log "warning: removing the pods failed (see $LOGS/cri-reset.log)"
    fi
    stop_component containerd
    kill_leftover_pods
    stop_component kube-proxy
    if [ -x "$(kube_dir)/bin/kube-proxy" ]; then
        env PATH="$WRAP_BIN:$PATH" "$(kube_dir)/bin/kube-proxy" --cleanup >>"$LOGS/kube-proxy.log" 2>&1 || true
    fi
    stop_component kube-apiserver
    stop_component etcd
    umount_under "$STATE"
    restore_host
    local left
    left=$(host_leftovers)
    if [ -n "$left" ]; then
        log "down left these behind (state kept at $STATE):"
        printf '  %s\n' "$left" >&2
        return 1
    fi
    rm -rf "$STATE"
    log "cluster down; nothing of it runs or stays mounted"
}

# cluster_healthy: every component runs and the node is Ready.
cluster_healthy() {
    local c
    for c in "${COMPONENTS[@]}"; do component_running "$c" || return 1; done
    node_ready
}

cmd_status() {
    local c rc=0
    if [ ! -d "$STATE" ]; then
        echo "no cluster at $STATE (scripts/cluster.sh up starts one)"
        return 1
    fi
    for c in "${COMPONENTS[@]}"; do
        if component_running "$c"; then
            printf '%-24s running (pid %s)\n' "$c" "$(cat "$PIDS/$c.pid")"
        else
            printf '%-24s not running\n' "$c"
            rc=1
        fi
    done
    if [ -f "$KUBECONFIG_ADMIN" ] && kubectl_admin get node "$NODE_NAME" >/dev/null 2>&1; then
        kubectl_admin get node "$NODE_NAME" -o wide
        node_ready || rc=1
    else
        printf 'node %s: the API server does not answer\n' "$NODE_NAME"
        rc=1
    fi
    return "$rc"
}

cmd_env() {
    printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_ADMIN"
    printf 'export PATH=%q:"$PATH"\n' "$(tools_bin)"
}

cmd_logs() {
    local name=${1:-}
    [ -n "$name" ] || die "usage: scripts/cluster.sh logs NAME (one of: ${COMPONENTS[*]})"
    [ -f "$LOGS/$name.log" ] || die "no log for $name at $LOGS/$name.log"
    cat "$LOGS/$name.log"
}

cmd_load() {
    local file=${1:-}
    [ -f "$file" ] || die "usage: scripts/cluster.sh load FILE.tar (an OCI archive)"
    component_running containerd || die "the cluster is not up (scripts/cluster.sh up)"
    load_image "$file"
    log "loaded $file"
}

cmd_tag() {
    local image=${1:-} name=${2:-}
    [ -n "$image" ] && [ -n "$name" ] || die "usage: scripts/cluster.sh tag IMAGE NEW_NAME"
    component_running containerd || die "the cluster is not up (scripts/cluster.sh up)"
    tag_image "$(qualified_image "$image")" "$(qualified_image "$name")" \
        || die "no image $image in the cluster (scripts/cluster.sh images loads tidegate's)"
    log "tagged $image as $name"
}

main() {
    local cmd=${1:-}
    [ $# -gt 0 ] && shift
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status "$@" ;;
        env) cmd_env "$@" ;;
        images) cmd_images "$@" ;;
        load) cmd_load "$@" ;;
        tag) cmd_tag "$@" ;;
        install) cmd_install "$@" ;;
        logs) cmd_logs "$@" ;;
        host-snapshot) host_report ;;
        -h | --help | help) usage ;;
        "") usage >&2 && exit 2 ;;
        *) die "unknown command: $cmd (scripts/cluster.sh --help lists the commands)" ;;
    esac
}

main "$@"
