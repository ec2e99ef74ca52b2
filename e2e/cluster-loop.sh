#!/usr/bin/env bash
# The loop on pods: e2e/loop.sh's steps on the real cluster (scripts/cluster.sh), with the
# chart installed by Helm, engines and routers as pods of the pool's Deployments, and a real
# Prometheus discovering the engine pods through the cluster's API the way the chart's
# engineMonitor PodMonitor selects them (label app.kubernetes.io/name=tidegate-engine, port
# http, `pool` from the pod label tidegate.dev/pool). Prometheus runs on the node (the host),
# with the cluster's kubeconfig; the operator reads it at the node's address.
#
# Steps: pool min 1 / max 3 → Ready → load from several tenants through the pool's Service →
# 3 replicas (the Deployment's replicas, the ReplicaSet's pods, Ready by probes) → admission
# paused (kubectl shows it) → through the Service: new tenant of a pausable tier 503 with
# Retry-After, existing tenant 200 → faults (e2e/cluster/loop-faults.sh): an engine's process
# killed on the node mid-stream, an engine pod force-deleted mid-stream, a router pod deleted
# (only the killed engine's streams end, every router takes it out within a second, or for
# a deleted pod within the kubelet's 2 s minimum grace, the
# kubelet or the ReplicaSet brings it back, the Service keeps answering, the PDB holds the
# other router) → a pool template change rolls the engines one at a time, nothing lost
# (e2e/cluster/loop-roll.sh) → the operator's pod deleted while paused and scaling to a raised ceiling
# (the new leader adopts, keeps the admission state, its since and every tenant, converges
# without a reversal) → Prometheus stopped (no scale-down, MetricsAvailable=False) and
# restarted → load stops → admission reopens after the hold time → a drained scale-down in
# which the pod the operator drained is the pod the ReplicaSet deletes and no stream in flight
# is lost → what each fault cost the load → Events tell each step → a second pool at replicas.min 0 answers one request held
# by its router after it scaled 0 → 1.
# Needs root. Brings the cluster up when none runs, and down again at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
. e2e/lib.sh
. e2e/loop-lib.sh

CLUSTER=scripts/cluster.sh
NS=e2e-loop
POOL=tide
OPNS=tidegate-system
MODELS=/var/lib/tidegate/models
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-cluster-loop.XXXXXX")
TARGETS=$WORK/targets.json
ROUTERS=$WORK/routers.json
STARTED=0
PIDS=()

cleanup() {
    stop_background
    if [ "$STARTED" = 1 ] && [ -z "${TIDEGATE_E2E_KEEP_CLUSTER:-}" ]; then
        bash "$CLUSTER" down >/dev/null 2>&1 || bash "$CLUSTER" down
    elif [ -z "${TIDEGATE_E2E_KEEP_CLUSTER:-}" ]; then
        helm uninstall tidegate -n "$OPNS" --wait >/dev/null 2>&1
        kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1
        kubectl delete pv tidegate-models-e2e-loop >/dev/null 2>&1
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then
    echo "e2e/cluster-loop.sh needs root (the kubelet, containerd and the pod network do)"
    exit 1
fi

echo "== the loop on pods: cluster, Helm, Prometheus, engine and router pods, the operator"
if ! bash "$CLUSTER" status >/dev/null 2>&1; then
    t0=$SECONDS
    if bash "$CLUSTER" up >"$WORK/up.log" 2>&1; then
        STARTED=1
        pass "scripts/cluster.sh up ($((SECONDS - t0))s)"
    else
        STARTED=1
        fail "scripts/cluster.sh up" "$(tail -30 "$WORK/up.log")"
        summary
        exit 1
    fi
fi
eval "$(bash "$CLUSTER" env)"
export TIDEGATE_IMAGE_PROFILE=${TIDEGATE_IMAGE_PROFILE:-debug}
check "the engine and operator images built and loaded" bash "$CLUSTER" images
TARGET_DIR=${CARGO_TARGET_DIR:-target}/$TIDEGATE_IMAGE_PROFILE
[ -d "$MODELS/tiny-random" ] || "$TARGET_DIR/tidegate-engine" gen-random-model --out "$MODELS/tiny-random" >/dev/null
NODE_IP=$(kubectl get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')

. e2e/cluster/loop-setup.sh
. e2e/cluster/loop-steps.sh
