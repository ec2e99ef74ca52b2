# shellcheck shell=bash
# What e2e/loop.sh (engines as local processes) and e2e/cluster-loop.sh (engines as pods)
# share: the pool under test and its tiers, and the checks of a paused pool. Sourced after
# e2e/lib.sh, with NS, POOL, TARGETS and ROUTERS set.

# loop_pool_manifests MODEL_URI EXTRA_ENGINE_YAML METRICS_YAML: the TierPolicy and the pool,
# min 1 / max 3, with scaling and admission fast enough for a test (2 s ticks, 4 s to pause,
# 10 s hold). EXTRA_ENGINE_YAML: more `engine:` fields, each line indented by four spaces.
loop_pool_manifests() {
    cat <<EOF
apiVersion: tidegate.dev/v1alpha1
kind: TierPolicy
metadata: {name: tiers, namespace: $NS}
spec:
  defaultTier: free
  tiers:
    - {name: enterprise, priority: 100, queueWaitTarget: 5s, admission: {pausable: false}}
    - {name: standard, priority: 50, queueWaitTarget: 8s}
    - {name: free, priority: 10, queueWaitTarget: 10s, kvRetention: {onPressure: Drop}}
  tenancy:
    gatewayHeaders: {tenantHeader: x-tidegate-tenant, tierHeader: x-tidegate-tier}
---
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: $POOL, namespace: $NS}
spec:
  model: {name: tiny-random, uri: "$1"}
  engine:
    image: tidegate-engine:local
    resources: {gpus: 0, memory: 256Mi}
    kvCache: {memoryFraction: 0.2, hostOffload: 64Mi}
    maxBatchSize: 4
    maxQueuedRequests: 64
    drainGracePeriod: 60s
$2
  replicas: {min: 1, max: 3}
  slo: {tokensPerSecondPerSession: 50, queueWaitP99: 300ms, targetUtilization: 0.7}
  scaling:
    interval: 2s
    scaleUpStabilization: 0s
    scaleDownStabilization: 10s
    maxScaleUpStep: 1
    maxScaleDownStep: 1
    metrics: $3
  admission: {pauseThreshold: 0.9, resumeThreshold: 0.5, pauseAfter: 4s, holdTime: 10s, retryAfter: 2s}
  tierPolicyRef: {name: tiers}
EOF
}

# check_paused_admission VIA: with the pool paused, `kubectl get inferencepools` shows it;
# through the pool's front door (VIA says which: "at the router", "through the Service") a
# new tenant of a pausable tier gets 503 with Retry-After, an existing tenant and a new
# tenant of a non-pausable tier 200.
check_paused_admission() {
    local table code typ retry
    table=$(kubectl -n "$NS" get inferencepools)
    echo "$table" | sed 's/^/       | /'
    grep -q PausedNewTenants <<<"$table" && pass "kubectl get inferencepools shows PausedNewTenants" ||
        fail "kubectl get inferencepools shows PausedNewTenants" "$table"
    read -r code typ retry _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant brand-new-tenant --tier free)
    if [ "$code" = 503 ] && [ "$typ" = new_tenant_admission_paused ] && [ "$retry" != - ]; then
        pass "new tenant of a pausable tier, $1: 503 $typ, Retry-After $retry"
    else
        fail "new tenant of a pausable tier, $1: 503 new_tenant_admission_paused with Retry-After" "got $code $typ $retry"
    fi
    read -r code typ _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant tenant-001 --tier standard)
    [ "$code" = 200 ] && pass "existing tenant, $1: 200" || fail "existing tenant, $1: 200" "got $code $typ"
    read -r code typ _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant new-enterprise --tier enterprise)
    [ "$code" = 200 ] && pass "new tenant of a non-pausable tier, $1: 200" || fail "new tenant of a non-pausable tier, $1: 200" "got $code $typ"
}

# loop_zero_pool_manifest MODEL_URI EXTRA_ENGINE_YAML SCALING_EXTRA HOLD: the second pool,
# `zero`, at replicas.min 0: its router holds a request for up to HOLD until an engine is up.
loop_zero_pool_manifest() {
    cat <<EOF
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: zero, namespace: $NS}
spec:
  model: {name: tiny-random, uri: "$1"}
  engine:
    image: tidegate-engine:local
    resources: {gpus: 0, memory: 256Mi}
    kvCache: {memoryFraction: 0.2}
    maxBatchSize: 4
$2
  replicas: {min: 0, max: 1}
  scaling: {interval: 1s, scaleDownStabilization: 600s$3}
  router: {holdTimeout: $4}
  tierPolicyRef: {name: tiers}
EOF
}

# stop_background: ends the load (its stop file) and every process in PIDS, TERM then KILL.
stop_background() {
    local p
    touch "$WORK/stop-load"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 1
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
}

# start_prometheus LISTEN_HOST: PROM_BIN with $WORK/prometheus.yml on LISTEN_HOST:PROM_PORT
# (sets PROM_PID, adds it to PIDS); returns once it is ready, 1 after 30 s.
start_prometheus() {
    local _
    "$PROM_BIN" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom-data" \
        --web.listen-address="$1:$PROM_PORT" >>"$WORK/prometheus.log" 2>&1 &
    PROM_PID=$!
    PIDS+=("$PROM_PID")
    for _ in $(seq 1 60); do
        curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null && return 0
        sleep 0.5
    done
    return 1
}

# register_free_tenant: makes tenant-002 (a free-tier base user of the load) an existing tenant
# before the load starts: a probe answered 200, then its id in the registry (30 s each). The
# load's own free-tier users are admitted only if an answer comes before the pause; on a slow
# machine none did, and check_state_kept then had no existing free tenant to probe.
register_free_tenant() {
    local code typ t0=$SECONDS
    until read -r code typ _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant tenant-002 --tier free) &&
        [ "$code" = 200 ]; do
        [ $((SECONDS - t0)) -ge 30 ] && { fail "a free-tier tenant admitted before the load" "got $code $typ"; return; }
        sleep 1
    done
    wait_for "a free-tier tenant admitted before the load is in the registry (tenant-002)" 30 free_tenant_registered
}
free_tenant_registered() { registry_tenants | grep -qx tenant-002; }

# check_state_kept WHAT NEWCOMER: after WHAT (an operator restart, a leader takeover) the pool
# is still paused with the same since (SINCE_BEFORE), the registry lost none of
# TENANTS_BEFORE, an existing tenant of the paused free tier is admitted and NEWCOMER, a new
# one, is refused. Needs jp, is and registry_tenants from the caller.
check_state_kept() {
    local since_after lost existing_free code typ
    is '{.status.admission.state}' PausedNewTenants && pass "admission still PausedNewTenants after $1" ||
        fail "admission still PausedNewTenants after $1" "$(jp '{.status.admission}')"
    since_after=$(jp '{.status.admission.since}')
    [ "$since_after" = "$SINCE_BEFORE" ] && pass "admission since kept across $1 ($SINCE_BEFORE)" ||
        fail "admission since kept across $1" "before $SINCE_BEFORE, after $since_after"
    lost=$(comm -23 <(echo "$TENANTS_BEFORE") <(registry_tenants | sort))
    [ -z "$lost" ] && pass "no tenant lost from the registry ($(echo "$TENANTS_BEFORE" | grep -c .) before $1, $(registry_tenants | grep -c .) after)" ||
        fail "no tenant lost from the registry across $1" "lost: $lost"
    # An existing tenant of the paused free tier: one the registry holds (the load's free-tier
    # base users are 2, 3, 5 and 8; each is existing from the moment the router accepted one
    # of its requests, so all that sent one before the pause are in it).
    existing_free=$(registry_tenants | grep -m1 -x -e tenant-002 -e tenant-003 -e tenant-005 -e tenant-008)
    read -r code typ _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant "${existing_free:-tenant-002}" --tier free)
    [ "$code" = 200 ] && pass "an existing tenant of a paused tier ($existing_free) is still admitted: 200" ||
        fail "an existing tenant of a paused tier is still admitted" "got $code $typ for ${existing_free:-no free-tier base user in the registry}"
    read -r code typ _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant "$2" --tier free)
    [ "$code" = 503 ] && pass "a new tenant of a paused tier is still refused: 503 $typ" ||
        fail "a new tenant of a paused tier is still refused" "got $code $typ"
}
