#!/usr/bin/env bash
# The cluster e2e: tidegate on a real single-node Kubernetes cluster (scripts/cluster.sh:
# upstream components built from source, containerd + runc, images built here), the chart
# installed by real Helm, the example pools serving from pods. Runs the quickstart of
# docs/operations.md ("Try it on a local cluster") line by line:
#   1. the quickstart of docs/operations.md, line by line: the cluster up (or reuse one that
#      runs), the images built and loaded, helm install, the models on the node's volume,
#      examples/cluster/ and the tier policies applied, a chat completion;
#   2. the chart: helm lint, helm template | kubectl apply --dry-run=server; the operator
#      Deployment Ready, its leader Lease held, the CRDs established;
#   3. RBAC: the operator's service account against a kubectl auth can-i matrix (what it
#      must be able to do and what it must not), and the admission policy that keeps it to
#      the objects it manages;
#   4. the pools: what `render` prints admitted by the API server, every engine and router
#      pod Running and Ready by its own probes, `kubectl get inferencepools` with live values,
#      a chat completion through each pool's ClusterIP Service answered by an engine
#      (x-tidegate-engine), cluster DNS from a pod, the engine's KV pool sized within its
#      cgroup limit, an engine pod deleted with a stream in flight (drained, exit 0);
#   4b. a pool whose model is on an S3 server (SeaweedFS on the node's address): fetched by the
#      engine pod's init container and served; a wrong key gives Ready=False ModelFetchFailed;
#   5. helm upgrade with a changed value: the operator rolls, the pools' pods are untouched;
#   6. helm uninstall: the pools keep serving (the CRDs stay, as Helm leaves crds/ alone);
#      deleting a pool removes its objects (owner references); the CRDs deleted last;
#   7. down (when this script brought the cluster up): nothing left behind.
# Needs root. TIDEGATE_E2E_KEEP_CLUSTER=1 leaves a cluster it started running.
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/lib.sh

CLUSTER=scripts/cluster.sh
NS=tidegate-system
RELEASE=tidegate
SA=system:serviceaccount:$NS:tidegate
MODELS=/var/lib/tidegate/models
WORK=$(mktemp -d)
STARTED=0

S3_PIDS=()
cleanup() {
    local rc=$?
    # The S3 step's server, when the script ends inside that step (set -e): it outlived the
    # script before, holding its ports and data directory.
    for p in "${S3_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$STARTED" = 1 ] && [ -z "${TIDEGATE_E2E_KEEP_CLUSTER:-}" ]; then
        bash "$CLUSTER" down >"$WORK/down.log" 2>&1 || cat "$WORK/down.log"
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

# What a timed-out wait prints: the pods, the recent events, the operator's log.
wait_context() {
    kubectl get pods -A -o wide 2>&1 | tail -20
    kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -15
    kubectl logs -n "$NS" deploy/tidegate --tail=15 2>&1 || true
}

if [ "$(id -u)" != 0 ]; then
    echo "e2e/cluster.sh needs root (the kubelet, containerd and the pod network do)"
    exit 1
fi

# ---- 1. the quickstart, as the docs give it (it brings the cluster up when none runs)
if bash "$CLUSTER" status >/dev/null 2>&1; then
    echo "== a cluster is up already: using it"
else
    bash "$CLUSTER" host-snapshot >"$WORK/host.before"
    STARTED=1
fi
. e2e/cluster/quickstart.sh
check "kubectl and helm are the cluster's own" bash -c \
    '[ "$(command -v kubectl)" = "$(dirname "$(command -v helm)")/kubectl" ]'
echo "   $(kubectl version 2>/dev/null | tr '\n' ' ')"
# ---- 2. the chart, by Helm
. e2e/cluster/chart.sh
# ---- 3. RBAC, enforced
. e2e/cluster/rbac.sh
# ---- 4. the pools, from pods
. e2e/cluster/pools.sh
# ---- 4b. a pool whose model comes from S3
. e2e/cluster/model-s3.sh
# ---- 5 and 6. upgrade and uninstall
. e2e/cluster/lifecycle.sh

# ---- 7. down
if [ "$STARTED" = 1 ] && [ -z "${TIDEGATE_E2E_KEEP_CLUSTER:-}" ]; then
    echo "== down"
    t0=$SECONDS
    if bash "$CLUSTER" down >"$WORK/down.log" 2>&1; then
        pass "scripts/cluster.sh down ($((SECONDS - t0))s)"
    else
        fail "scripts/cluster.sh down" "$(cat "$WORK/down.log")"
    fi
    STARTED=0
    bash "$CLUSTER" host-snapshot >"$WORK/host.after"
    check "down leaves the host as up found it (processes, mounts, links, iptables, sysctls, paths)" \
        diff "$WORK/host.before" "$WORK/host.after"
fi

summary
