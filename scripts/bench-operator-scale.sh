#!/usr/bin/env bash
# The operator at scale (a benchmark that prints figures, not a test): 100 pools of 10 engine
# pods (and 2 router pods) each on simulated nodes, on the real single-node cluster of
# scripts/cluster.sh. Prints a table of what the operator costs the API server and itself:
#   - API requests per second at steady state, from the API server's own metrics (a
#     FlowSchema that matches only the operator's ServiceAccount; its dispatched-requests
#     counter counts every request, watch starts included);
#   - reconcile-to-applied latency after a spec change of every pool at once (p50/p99/max);
#   - the operator's CPU and RSS at steady state (and its peak RSS);
#   - an operator restart: time to the Lease and until every pool has ticked again, the
#     requests that took, and whether any Deployment or pod changed on the way.
#
#   sudo scripts/bench-operator-scale.sh                 # 100 pools × 10 engines
#   sudo scripts/bench-operator-scale.sh --pools 20 --steady 60
#
# How the pods are simulated: kwok (sigs.k8s.io/kwok, built once from the Go module proxy,
# cached under the cluster cache keyed by version) runs the simulated nodes and their pods:
# scheduled by the real scheduler, created by the real ReplicaSet controller, Ready without a
# container. Each simulated node's pod range is on loopback (127.1.N.0/24), so every pod
# address is this machine's: one real `tidegate-engine serve` (fake backend) answers every
# engine pod's API and /metrics on port 8000, and scripts/operator-scale/admin_proxy.py sends
# every pod's admin calls (port 8001) to one real engine or one real router by path. The
# operator runs on this machine as its release binary, with the chart's ServiceAccount token
# and RBAC (the chart is installed with no operator pod), so that it can reach the loopback
# pod addresses, and so that its CPU, memory and restart are measured directly. The pools use
# `metrics.source: Direct` (the operator scrapes every engine pod each tick: the heavier
# source for the operator itself). The cluster's one real node is cordoned while the bench
# runs, so that no simulated pool's pod lands on it.
#
# Needs root and about 4 GiB of memory; takes about 10 minutes after the builds.
set -euo pipefail

POOLS=100
REPLICAS=10
NAMESPACES=10
NODES=6
SETTLE=60
STEADY=180
INTERVAL=15s
KEEP_CLUSTER=0
KWOK_VERSION=v0.8.0
FLOWSCHEMA=tidegate-operator-bench
SA=tidegate-operator

usage() {
    cat <<EOF
Usage: scripts/bench-operator-scale.sh [options]

The tidegate operator with many pools on simulated nodes; prints a table of its API
requests, reconcile latency, CPU, memory and restart convergence.

Options:
  --pools N          pools (default $POOLS)
  --replicas N       engine pods per pool (default $REPLICAS)
  --namespaces N     namespaces the pools are spread over (default $NAMESPACES)
  --nodes N          simulated nodes, 250 pods each (default $NODES)
  --interval D       each pool's spec.scaling.interval (default $INTERVAL)
  --settle S         seconds between convergence and the steady window (default $SETTLE)
  --steady S         seconds of the steady-state window (default $STEADY)
  --keep-cluster     leave a cluster this script started running
  -h, --help         this text
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --pools) POOLS=$2; shift 2 ;;
        --replicas) REPLICAS=$2; shift 2 ;;
        --namespaces) NAMESPACES=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --interval) INTERVAL=$2; shift 2 ;;
        --settle) SETTLE=$2; shift 2 ;;
        --steady) STEADY=$2; shift 2 ;;
        --keep-cluster) KEEP_CLUSTER=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[scale %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (it starts the cluster and binds ports 8000 and 8001)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
helper=scripts/operator-scale/scale.py
for port in 8000 8001 9101 9200 9201 18001 18080; do
    if ss -Htln "sport = :$port" | grep -q .; then
        die "port $port is in use (the simulated pods' ports and the bench's own)"
    fi
done

cache="${TIDEGATE_CLUSTER_CACHE:-$HOME/.cache/tidegate/cluster}"
kwok_bin="$cache/kwok-$KWOK_VERSION/kwok"
if [ ! -x "$kwok_bin" ]; then
    log "building kwok $KWOK_VERSION from the Go module proxy"
    mkdir -p "$(dirname "$kwok_bin")"
    GOBIN="$(dirname "$kwok_bin")" GOFLAGS=-buildvcs=false go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
# kwok's own stages (its repository's kustomize/stage files, from the module it was built
# from): nodes turn Ready and keep a Lease; pods get an address and turn Ready at once.
stages="$(dirname "$kwok_bin")/stages.yaml"
if [ ! -f "$stages" ]; then
    src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        echo ---
        cat "$src/$f"
    done >"$stages.new"
    mv "$stages.new" "$stages"
fi
log "building the operator and the engine (release)"
cargo build --release --quiet --locked -p tidegate-operator -p tidegate-engine
bin_dir="${CARGO_TARGET_DIR:-$root/target}/release"

started_cluster=0
if ! scripts/cluster.sh status >/dev/null 2>&1; then
    scripts/cluster.sh up
    started_cluster=1
fi
eval "$(scripts/cluster.sh env)"
real_node=$(kubectl get nodes -l '!type' -o jsonpath='{.items[0].metadata.name}')

work=$(mktemp -d /tmp/tidegate-scale.XXXXXX)
pids=()
cleanup() {
    set +e
    log "cleaning up (logs in $work)"
    [ -n "${op_pid:-}" ] && kill "$op_pid" 2>/dev/null
    kubectl delete namespace $(seq -f 'scale-%g' 0 $((NAMESPACES - 1))) --wait=false >/dev/null 2>&1
    kubectl delete flowschema "$FLOWSCHEMA" >/dev/null 2>&1
    if [ "$started_cluster" = 1 ] && [ "$KEEP_CLUSTER" = 0 ]; then
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
        wait 2>/dev/null
        scripts/cluster.sh down
        return
    fi
    # Simulated pods leave only while kwok runs: wait for them, then remove the nodes.
    for _ in $(seq 1 120); do
        [ "$(kubectl get pods -A -l tidegate.dev/pool --no-headers 2>/dev/null | wc -l)" = 0 ] && break
        sleep 1
    done
    kubectl delete nodes -l type=kwok --wait=false >/dev/null 2>&1
    helm uninstall tidegate -n tidegate-system >/dev/null 2>&1
    kubectl uncordon "$real_node" >/dev/null 2>&1
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap cleanup EXIT

# ---------- the cluster side: chart (no operator pod), FlowSchema, simulated nodes ----------
log "installing the chart's CRDs and RBAC (no operator pod)"
helm install tidegate charts/tidegate -n tidegate-system --create-namespace \
    --set replicaCount=0 --set serviceAccount.name="$SA" >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: $FLOWSCHEMA
spec:
  matchingPrecedence: 500
  priorityLevelConfiguration:
    name: workload-high
  distinguisherMethod:
    type: ByUser
  rules:
    - subjects:
        - kind: ServiceAccount
          serviceAccount: {name: $SA, namespace: tidegate-system}
      resourceRules:
        - {verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}
      nonResourceRules:
        - {verbs: ["*"], nonResourceURLs: ["*"]}
EOF
server=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
sa_token=$(kubectl -n tidegate-system create token "$SA" --duration=4h)
cat >"$work/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: operator, user: {token: "$sa_token"}}]
contexts: [{name: c, context: {cluster: c, user: operator, namespace: tidegate-system}}]
current-context: c
EOF

kubectl cordon "$real_node" >/dev/null
log "starting kwok and $NODES simulated nodes"
"$kwok_bin" --kubeconfig "$KUBECONFIG" --config "$stages" --node-lease-duration-seconds 40 \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --cidr 127.1.0.0/16 >"$work/kwok.log" 2>&1 &
pids+=("$!")
python3 "$helper" nodes "$NODES" | kubectl apply -f - >/dev/null
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s >/dev/null

# ---------- what the simulated pods' addresses answer with ----------
token=$(openssl rand -hex 24)
TIDEGATE_ADMIN_TOKEN=$token "$bin_dir/tidegate-engine" serve --fake-model --listen 0.0.0.0:8000 \
    --admin-listen 127.0.0.1:9101 >"$work/engine.log" 2>&1 &
pids+=("$!")
TIDEGATE_ADMIN_TOKEN=$token "$bin_dir/tidegate-engine" route --listen 127.0.0.1:9200 \
    --admin-listen 127.0.0.1:9201 >"$work/router.log" 2>&1 &
pids+=("$!")
python3 scripts/operator-scale/admin_proxy.py --listen 0.0.0.0:8001 \
    --engine 127.0.0.1:9101 --router 127.0.0.1:9201 >"$work/proxy.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do
    curl -fsS http://127.0.0.1:8000/readyz >/dev/null 2>&1 && break
    sleep 0.2
done
curl -fsS http://127.0.0.1:8000/readyz >/dev/null || die "the engine did not start ($work/engine.log)"

# ---------- the operator ----------
start_operator() {
    TIDEGATE_LOG_FORMAT=json "$bin_dir/tidegate-operator" run \
        --kubeconfig "$work/operator.kubeconfig" --leader-election \
        --lease-namespace tidegate-system --metrics-listen 127.0.0.1:18080 >"$1" 2>&1 &
    op_pid=$!
    op_started=$(date +%s.%N)
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
apf() { python3 "$helper" apf-count "$FLOWSCHEMA"; }
operator_metric() {
    curl -fsS http://127.0.0.1:18080/metrics | awk -v m="$1" 'index($1, m) == 1 {s += $2} END {print s + 0}'
}
now() { date +%s.%N; }
# wait_leader LOG: seconds from the operator's start until it holds the Lease.
wait_leader() {
    for _ in $(seq 1 600); do
        if grep -q '"became leader"' "$1" 2>/dev/null; then
            awk -v a="$op_started" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'
            return 0
        fi
        kill -0 "$op_pid" 2>/dev/null || break
        sleep 0.1
    done
    tail -5 "$1" >&2
    die "the operator did not take the Lease ($1)"
}

start_operator "$work/operator.log"
wait_leader "$work/operator.log" >/dev/null
log "applying $POOLS pools × $REPLICAS engine pods in $NAMESPACES namespaces"
t_apply=$(now)
python3 "$helper" pools --pools "$POOLS" --namespaces "$NAMESPACES" --replicas "$REPLICAS" \
    --interval "$INTERVAL" --token "$token" | kubectl apply -f - >/dev/null
engine_pods=$((POOLS * REPLICAS))
wait_pods_ready() {
    local want=$1 deadline=$((SECONDS + 900)) ready
    while [ $SECONDS -lt $deadline ]; do
        ready=$(kubectl get pods -A -l app.kubernetes.io/name=tidegate-engine --no-headers 2>/dev/null \
            | awk '$3 == "1/1" && $4 == "Running"' | wc -l)
        [ "$ready" -ge "$want" ] && return 0
        sleep 5
    done
    die "only $ready of $want engine pods Ready after 15 minutes"
}
wait_pods_ready "$engine_pods"
t_rollout=$(awk -v a="$t_apply" -v b="$(now)" 'BEGIN {printf "%.0f", b - a}')
log "all $engine_pods engine pods Ready ${t_rollout}s after the apply; settling ${SETTLE}s"
sleep "$SETTLE"

# ---------- steady state ----------
log "steady state: measuring ${STEADY}s"
a0=$(apf); c0=$(cpu_ticks "$op_pid"); r0=$(operator_metric tidegate_operator_reconciles_total)
w0=$(operator_metric 'tidegate_operator_status_writes_total{reason="skip"}')
t0=$(now)
sleep "$STEADY"
a1=$(apf); c1=$(cpu_ticks "$op_pid"); r1=$(operator_metric tidegate_operator_reconciles_total)
w1=$(operator_metric 'tidegate_operator_status_writes_total{reason="skip"}')
t1=$(now)
rss_kib=$(status_kib "$op_pid" VmRSS)
hz=$(getconf CLK_TCK)
steady=$(awk -v a0="$a0" -v a1="$a1" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$hz" \
    -v r0="$r0" -v r1="$r1" -v w0="$w0" -v w1="$w1" -v pools="$POOLS" 'BEGIN {
    d = t1 - t0; rate = (a1 - a0) / d
    printf "%.2f %.2f %.1f %d %d", rate, rate * 100 / pools, (c1 - c0) / hz / d * 100, r1 - r0, (r1 - r0) - (w1 - w0)
}')
read -r req_s req_s_100 cpu_pct ticks writes <<<"$steady"

# ---------- a spec change of every pool at once ----------
log "spec change: replicas.min $REPLICAS → $((REPLICAS + 1)) on every pool at once"
kubectl proxy --port 18001 >"$work/proxy-kubectl.log" 2>&1 &
pids+=("$!")
sleep 1
change=$(python3 "$helper" spec-change --pools "$POOLS" --namespaces "$NAMESPACES" \
    --proxy http://127.0.0.1:18001 --target $((REPLICAS + 1)))
log "spec change: $change"
read -r p50 p99 pmax applied <<<"$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); print(c["p50_s"], c["p99_s"], c["max_s"], c["applied"])' "$change")"
wait_pods_ready $((POOLS * (REPLICAS + 1)))

# ---------- an operator restart ----------
sleep 20
state() {
    kubectl get deploy -A -l app.kubernetes.io/managed-by=tidegate-operator \
        -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}={.spec.replicas}@{.metadata.generation} {end}'
    echo
    kubectl get pods -A -l tidegate.dev/pool -o jsonpath='{range .items[*]}{.metadata.name} {end}' | tr ' ' '\n' | sort | md5sum
}
before=$(state)
peak_kib=$(status_kib "$op_pid" VmHWM)
log "restart: SIGTERM to the operator, then a new one"
kill -TERM "$op_pid"
wait "$op_pid" 2>/dev/null || true
a0=$(apf)
start_operator "$work/operator-2.log"
lease_s=$(wait_leader "$work/operator-2.log")
converge_s=$(python3 "$helper" converged "$work/operator-2.log" "$POOLS" "$op_started")
a1=$(apf)
sleep 5
after=$(state)
changed="none"
[ "$before" = "$after" ] || changed="CHANGED (see $work)"
printf '%s\n' "$before" >"$work/state-before"
printf '%s\n' "$after" >"$work/state-after"

cpu_model=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
cat <<EOF

The operator at scale: $POOLS pools × $REPLICAS engine pods (+ 2 routers each) on $NODES simulated nodes,
interval $INTERVAL, metrics source Direct; $(nproc) cores of $cpu_model.
Command: scripts/bench-operator-scale.sh --pools $POOLS --replicas $REPLICAS --steady $STEADY

| figure                                                        | measured              | goal            |
|---------------------------------------------------------------|-----------------------|-----------------|
| initial rollout: apply → all $engine_pods engine pods Ready          | ${t_rollout} s |                 |
| API requests/s at steady state (all verbs, watch starts incl.) | $req_s ($req_s_100 per 100 pools) | ≤ 2 per 100 pools |
| ticks / status writes in the ${STEADY} s window                     | $ticks / $writes |                 |
| reconcile-to-applied, every pool's spec changed at once       | p50 $p50 s, p99 $p99 s, max $pmax s ($applied/$POOLS) | p99 ≤ 2 s |
| operator CPU at steady state                                  | $cpu_pct % of a core |                 |
| operator RSS at steady state / peak                           | $((rss_kib / 1024)) MiB / $((peak_kib / 1024)) MiB | ≤ 256 MiB |
| restart: new process → Lease held                             | ${lease_s:-?} s |                 |
| restart: new process → every pool ticked                      | ${converge_s} s |                 |
| restart: API requests until then                              | $((a1 - a0)) |                 |
| restart: Deployments or pods changed                          | $changed |                 |
EOF
