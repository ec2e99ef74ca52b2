#!/usr/bin/env bash
# One object the operator cannot parse does not stop it, and SIGTERM always stops it.
# Real API server (CRDs only) and the operator binary with the local workload runtime.
#
# Steps: the operator started before the CRDs exist (every list fails) exits promptly on
# SIGTERM → a pool and a TierPolicy the operator cannot read are stored through a looser
# CRD (as objects stored before an upgrade tightened the schema would be), then the real
# CRDs are installed → beside them a good pool becomes Ready, the bad pool and the bad policy
# get Ready=False naming the field, the pool using the bad policy gets TierPolicyInvalid →
# fixing the bad pool makes it reconcile → SIGTERM stops the operator promptly.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

TARGET=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
PROFILE=${E2E_PROFILE:-debug}
OPERATOR=$TARGET/$PROFILE/tidegate-operator
ENGINE=$TARGET/$PROFILE/tidegate-engine
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-e2e-bad-object.XXXXXX")
NS=e2e-bad
# Seconds the operator may take to exit after SIGTERM: its drain limit (5 s) plus margin.
EXIT_LIMIT=8
OPERATOR_PID=

cleanup() {
    [ -n "$OPERATOR_PID" ] && kill -9 "$OPERATOR_PID" 2>/dev/null
    pkill -f "tidegate-engine serve.*$WORK" 2>/dev/null
    stop_api_server
}

# log_tail LOG: the operator's last lines, without the client's dumps of whole responses.
log_tail() { grep -v kube_client "$1" | tail -15 | cut -c1-400; }

# start_operator LOG: starts the operator in the background, its pid in OPERATOR_PID.
start_operator() {
    RUST_LOG=${RUST_LOG:-info} "$OPERATOR" run --workload local --namespaces "$NS" \
        --engine-bin "$ENGINE" --local-state-dir "$WORK/local" \
        --metrics-listen 127.0.0.1:0 >"$1" 2>&1 &
    OPERATOR_PID=$!
}

# stop_operator NAME LOG: SIGTERM, then passes when the operator exits within EXIT_LIMIT.
stop_operator() {
    local name=$1 log=$2 t0=$SECONDS
    kill -TERM "$OPERATOR_PID"
    while kill -0 "$OPERATOR_PID" 2>/dev/null && [ $((SECONDS - t0)) -lt "$EXIT_LIMIT" ]; do
        sleep 0.2
    done
    if kill -0 "$OPERATOR_PID" 2>/dev/null; then
        fail "$name (still running ${EXIT_LIMIT}s after SIGTERM)" "$(log_tail "$log")"
        kill -9 "$OPERATOR_PID" 2>/dev/null
    else
        pass "$name ($((SECONDS - t0))s)"
    fi
    wait "$OPERATOR_PID" 2>/dev/null
    OPERATOR_PID=
}

# field KIND NAME JSONPATH: one field of an object; ready KIND NAME FIELD: of its Ready condition.
field() { kubectl -n "$NS" get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
ready() { field "$1" "$2" "{.status.conditions[?(@.type==\"Ready\")].$3}"; }

# What a timed-out wait_for (lib.sh) prints: every object's status and the operator's log.
wait_context() {
    kubectl -n "$NS" get inferencepools,tierpolicies -o yaml | grep -A40 '^  status:' | head -80
    echo "operator log:"
    log_tail "$WORK/operator.log"
}

# The bad durations are over the operator's limit (277777h46m40s) but within what the API
# server's CEL can convert (about 2562047h): the real CRD's rules then evaluate to false on
# them, and validation ratcheting lets the operator write status on the unchanged object.
# (Beyond that range a rule fails to evaluate, which is not ratcheted: the status patch is
# refused and the operator can only log the problem.)

# loose_crd FILE: the CRD in FILE with its spec schema reduced to "any object", as an older
# or looser CRD would accept.
loose_crd() {
    kubectl create --dry-run=client -o json -f "$1" | python3 -c '
import json, sys
crd = json.load(sys.stdin)
for v in crd["spec"]["versions"]:
    props = v["schema"]["openAPIV3Schema"]["properties"]
    props["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    v["schema"]["openAPIV3Schema"].pop("x-kubernetes-validations", None)
json.dump(crd, sys.stdout)'
}

echo "== e2e bad object: real API server + operator, unreadable objects and SIGTERM"
if [ ! -x "$OPERATOR" ] || [ ! -x "$ENGINE" ]; then
    log "building binaries"
    build_binaries "$PROFILE" || exit 1
fi
start_api_server "$WORK/apiserver" || exit 1
trap cleanup EXIT

# --- SIGTERM while every list fails (no CRDs yet: 404 on every watch).
start_operator "$WORK/operator-no-crds.log"
wait_for "operator up and its lists failing (no CRDs)" 30 \
    grep -q "failed to perform initial object list" "$WORK/operator-no-crds.log"
stop_operator "SIGTERM stops the operator while its lists keep failing" "$WORK/operator-no-crds.log"

# --- Objects stored through a looser CRD, then the real CRDs.
for f in crds/tidegate.dev_inferencepools.yaml crds/tidegate.dev_tierpolicies.yaml; do
    loose_crd "$f" | kubectl apply -f - >/dev/null
done
kubectl wait --for condition=Established crd/inferencepools.tidegate.dev crd/tierpolicies.tidegate.dev --timeout=60s >/dev/null
for _ in $(seq 1 50); do kubectl get inferencepools -A >/dev/null 2>&1 && break; sleep 0.2; done
bad_objects=$(
    cat <<EOF
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: bad, namespace: $NS}
spec:
  model: {name: m, uri: "file:///models/m"}
  engine: {image: tidegate-engine:local, resources: {gpus: 0, memory: 256Mi}, kvCache: {memoryFraction: 0.2}}
  replicas: {min: 0, max: 1}
  scaling: {interval: 300000h}
---
apiVersion: tidegate.dev/v1alpha1
kind: TierPolicy
metadata: {name: bad-tiers, namespace: $NS}
spec:
  defaultTier: free
  tiers: [{name: free, queueWaitTarget: 300000h}]
EOF
)
check "unreadable pool and policy stored through a looser CRD" kubectl apply -f - <<<"$bad_objects"
check "real CRDs applied and Established" apply_crds
# New objects like them are refused now (the stored ones stay: ratcheting).
fresh=$(sed 's/{name: bad/{name: fresh-bad/' <<<"$bad_objects")
out=$(kubectl create --dry-run=server -f - <<<"$fresh" 2>&1)
if [ "$(grep -c "must be at most 277777h46m40s" <<<"$out")" -eq 2 ]; then
    pass "the real CRDs refuse new objects like them"
else
    fail "the real CRDs refuse new objects like them" "$out"
fi

"$ENGINE" gen-random-model --out "$WORK/model" >"$WORK/gen-model.log" 2>&1 ||
    fail "random model generated" "$(cat "$WORK/gen-model.log")"
check "good pools applied" kubectl apply -f - <<EOF
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: good, namespace: $NS}
spec:
  model: {name: tiny-random, uri: "file://$WORK/model"}
  engine: {image: tidegate-engine:local, resources: {gpus: 0, memory: 256Mi}, kvCache: {memoryFraction: 0.2}, maxBatchSize: 4}
  replicas: {min: 1, max: 1}
  scaling: {interval: 2s, metrics: {source: Direct, rateWindow: 5s, staleAfter: 10s}}
---
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: uses-bad-tiers, namespace: $NS}
spec:
  model: {name: tiny-random, uri: "file://$WORK/model"}
  engine: {image: tidegate-engine:local, resources: {gpus: 0, memory: 256Mi}, kvCache: {memoryFraction: 0.2}}
  replicas: {min: 0, max: 1}
  scaling: {interval: 2s, metrics: {source: Direct}}
  tierPolicyRef: {name: bad-tiers}
EOF

# --- The operator next to them.
start_operator "$WORK/operator.log"
wait_for "the good pool is reconciled and becomes Ready" 120 \
    bash -c "[ \"\$(kubectl -n $NS get inferencepool good -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"
wait_for "the bad pool gets Ready=False InvalidSpec" 30 \
    bash -c "[ \"\$(kubectl -n $NS get inferencepool bad -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].reason}')\" = InvalidSpec ]"
msg=$(ready inferencepool bad message)
if grep -qF "spec.scaling.interval: invalid duration" <<<"$msg"; then
    pass "its message names the field: $msg"
else
    fail "its message names the field" "$msg"
fi
wait_for "the pool using the bad policy gets Ready=False TierPolicyInvalid" 30 \
    bash -c "[ \"\$(kubectl -n $NS get inferencepool uses-bad-tiers -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].reason}')\" = TierPolicyInvalid ]"
msg=$(ready tierpolicy bad-tiers message)
if [ "$(ready tierpolicy bad-tiers reason)" = Invalid ] && grep -qF "spec.tiers[0].queueWaitTarget: invalid duration" <<<"$msg"; then
    pass "the bad policy gets Ready=False Invalid naming the field: $msg"
else
    fail "the bad policy gets Ready=False Invalid naming the field" "$(kubectl -n "$NS" get tierpolicy bad-tiers -o yaml)"
fi
if grep -q "failed to perform initial object list" "$WORK/operator.log"; then
    fail "no list failed to deserialize" "$(grep -v kube_client "$WORK/operator.log" | grep -m3 "initial object list" | cut -c1-400)"
else
    pass "no list failed to deserialize"
fi

# --- Fixing the bad pool: the operator reads it again and reconciles it.
check "the bad pool is fixed" kubectl -n "$NS" patch inferencepool bad --type=merge \
    -p '{"spec":{"scaling":{"interval":"2s"}}}'
wait_for "the fixed pool is reconciled (observedGeneration 2, no InvalidSpec)" 30 \
    bash -c "[ \"\$(kubectl -n $NS get inferencepool bad -o jsonpath='{.status.observedGeneration}')\" = 2 ] && [ \"\$(kubectl -n $NS get inferencepool bad -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].reason}')\" != InvalidSpec ]"

stop_operator "SIGTERM stops the operator while it runs pools" "$WORK/operator.log"
summary
