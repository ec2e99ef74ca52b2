#!/usr/bin/env bash
# The API slice against a real Kubernetes API server: CRDs are served and validated by the
# API server itself, examples are accepted, invalid examples are refused with their expected
# text, printer columns show status values, `kubectl explain` shows our docs, and
# `kubectl scale` writes the field the scale subresource points at.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

echo "== API slice: real API server (apiextensions-apiserver + etcd)"
start_api_server "${TMPDIR:-/tmp}/tidegate-e2e-api.$$" || exit 1
check "CRDs applied and Established" apply_crds

NS=inference
for f in examples/*.yaml examples/local/*.yaml; do
    check "example accepted: $f" kubectl apply -f "$f"
done

for f in examples/invalid/*.yaml; do
    expect=$(head -n1 "$f" | sed -n 's/^# expect: //p')
    if [ -z "$expect" ]; then
        fail "invalid example has no '# expect:' line: $f"
        continue
    fi
    if out=$(kubectl apply -f "$f" 2>&1); then
        fail "invalid example refused: $f" "accepted: $out"
    elif grep -qF -- "$expect" <<<"$out"; then
        pass "invalid example refused: $(basename "$f") ($expect)"
    else
        fail "invalid example refused with expected text: $f" "expected: $expect
got: $out"
    fi
done

POOL=llama-8b-chat
# Status as the operator writes it, through the status subresource.
status_patch='{"status":{"observedGeneration":1,"replicas":3,"readyReplicas":3,"desiredReplicas":4,
 "selector":"app.kubernetes.io/instance=llama-8b-chat",
 "measured":{"decodeTokensPerSecond":5123.4,"perReplicaCapacity":1800.5,"demandTokensPerSecond":6000.0,
   "utilization":1.11,"queueWaitP99":"1.2s","kvUtilization":0.82,"evictionsPerSecond":3.5},
 "admission":{"state":"PausedNewTenants","since":"2026-01-01T00:00:00Z","reason":"at max replicas and over SLO","pausedTiers":["free"]},
 "conditions":[{"type":"Ready","status":"True","reason":"AllReplicasReady","message":"3/3 ready","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}'
check "status patched through the status subresource" \
    kubectl -n "$NS" patch inferencepool "$POOL" --subresource=status --type=merge -p "$status_patch"

table=$(kubectl -n "$NS" get inferencepools 2>&1)
echo "$table" | sed 's/^/       | /'
header=$(head -n1 <<<"$table")
for col in NAME MODEL READY DESIRED TOKENS/S QUEUE-P99 ADMISSION AGE; do
    if grep -qw -- "$col" <<<"$header"; then pass "printer column $col"; else fail "printer column $col" "$header"; fi
done
row=$(grep "^$POOL " <<<"$table")
for value in llama-3.1-8b-instruct 3 4 5123.4 1.2s PausedNewTenants; do
    if grep -qw -- "$value" <<<"$row"; then pass "row shows $value"; else fail "row shows $value" "$row"; fi
done
check "kubectl get inferencepools.tidegate.dev (fully qualified, for clusters with GAIE)" \
    kubectl -n "$NS" get inferencepools.tidegate.dev "$POOL"
check "short name tgpool" kubectl -n "$NS" get tgpool "$POOL"
check "category tidegate lists both kinds" bash -c "kubectl -n $NS get tidegate | grep -q tierpolicy"

explain=$(kubectl explain inferencepool.spec 2>&1)
if grep -q "Replica bounds" <<<"$explain" && grep -q "The service level the pool is scaled to keep" <<<"$explain"; then
    pass "kubectl explain inferencepool.spec shows the field docs"
else
    fail "kubectl explain inferencepool.spec shows the field docs" "$explain"
fi
explain=$(kubectl explain tierpolicy.spec.tiers.kvRetention.onPressure 2>&1)
if grep -q "idle KV" <<<"$explain"; then pass "kubectl explain tierpolicy field docs"; else fail "kubectl explain tierpolicy field docs" "$explain"; fi

kubectl -n "$NS" patch inferencepool "$POOL" --type=merge -p '{"spec":{"scaling":{"mode":"Manual"}}}' >/dev/null
check "kubectl scale --replicas=3" kubectl -n "$NS" scale inferencepool/"$POOL" --replicas=3
manual=$(kubectl -n "$NS" get inferencepool "$POOL" -o jsonpath='{.spec.replicas.manual}')
if [ "$manual" = 3 ]; then pass "scale subresource wrote spec.replicas.manual=3"; else fail "scale subresource wrote spec.replicas.manual=3" "got '$manual'"; fi
scale=$(kubectl get --raw "/apis/tidegate.dev/v1alpha1/namespaces/$NS/inferencepools/$POOL/scale")
if grep -q '"selector":"app.kubernetes.io/instance=llama-8b-chat"' <<<"$scale" && grep -q '"replicas":3' <<<"$scale"; then
    pass "scale subresource reports status replicas and selector"
else
    fail "scale subresource reports status replicas and selector" "$scale"
fi
if out=$(kubectl -n "$NS" scale inferencepool/"$POOL" --replicas=20 2>&1); then
    fail "kubectl scale beyond replicas.max is refused" "$out"
else
    pass "kubectl scale beyond replicas.max is refused"
fi

defaults=$(kubectl -n "$NS" get inferencepool "$POOL" -o jsonpath='{.spec.engine.kvCache.blockTokens} {.spec.admission.enabled}')
[ "$defaults" = "16 true" ] && pass "schema defaults applied ($defaults)" || fail "schema defaults applied" "$defaults"

summary
