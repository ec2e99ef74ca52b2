# shellcheck shell=bash
# Sourced by e2e/cluster-loop.sh: the loop's steps, on pods.

wait_for "an engine pod comes up and the pool becomes Ready" 180 bash -c \
    "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ]"
wait_for "Prometheus scrapes the engine pod it discovered" 60 bash -c \
    "curl -sf 'http://127.0.0.1:$PROM_PORT/api/v1/query?query=up%7Bpool%3D%22$POOL%22%7D' | grep -q '\"value\":\\[[0-9.]*,\"1\"\\]'"

# registry_tenants: the tenant ids of the pool's registry ConfigMap, one a line.
registry_tenants() {
    kubectl -n "$NS" get configmap "$POOL-tenants" -o jsonpath='{.binaryData.registry\.bin}' 2>/dev/null \
        | base64 -d | python3 e2e/registry_tenants.py -
}
register_free_tenant

# ---- Load from several tenants and tiers, through the pool's Service (existing tenants
# first), as e2e/loop.sh runs it.
python3 e2e/load.py run --targets "$TARGETS" --routers "$ROUTERS" --out "$WORK/load.json" --users 48 --base-users 9 \
    --tokens 96 --duration 600 --ramp-start 6 --ramp-step 0.2 --stop-file "$WORK/stop-load" \
    --errors-out "$WORK/load-errors.txt" &
LOAD_PID=$!
PIDS+=("$LOAD_PID")

ready_engines() { engine_pods | awk '$3 == "true"' | grep -c .; }
three_pods_ready() {
    [ "$(kubectl -n "$NS" get deploy "$POOL" -o jsonpath='{.spec.replicas}')" = 3 ] && [ "$(ready_engines)" = 3 ]
}
wait_for "the pool scales to 3: Deployment replicas 3, three engine pods Ready by their probes" 240 three_pods_ready
wait_for "admission paused for new tenants at the ceiling" 150 is '{.status.admission.state}' PausedNewTenants
check_paused_admission "through the Service"

. e2e/cluster/loop-faults.sh
. e2e/cluster/loop-roll.sh

# ---- The operator's pod deleted while the pool is paused and scaling to a raised ceiling:
# the Deployment's next pod takes the Lease, adopts the pool as it is, keeps the admission
# state, its since and every tenant of the registry, and converges without a reversal.
wait_for "paused for new tenants before the operator's pod is deleted" 60 is '{.status.admission.state}' PausedNewTenants
SINCE_BEFORE=$(jp '{.status.admission.since}')
TENANTS_BEFORE=$(registry_tenants | sort)
OLD_OPERATOR=$(operator_pod)
kubectl -n "$NS" patch inferencepool "$POOL" --type merge -p '{"spec":{"replicas":{"max":4}}}' >/dev/null
t0=$SECONDS
until [ "$(jp '{.status.desiredReplicas}')" = 4 ] || [ $((SECONDS - t0)) -ge 60 ]; do sleep 0.2; done
ready_at_kill=$(jp '{.status.readyReplicas}')
kubectl -n "$OPNS" delete pod "$OLD_OPERATOR" --grace-period=0 --force >/dev/null 2>&1
if [ "$(jp '{.status.desiredReplicas}')" = 4 ] && [ "${ready_at_kill:-0}" -lt 4 ]; then
    pass "operator pod $OLD_OPERATOR deleted while paused and scaling 3 → 4 (desired 4, ready $ready_at_kill)"
else
    fail "operator pod deleted while paused and mid-scale" "desired $(jp '{.status.desiredReplicas}'), ready $ready_at_kill"
fi
new_leader() {
    local holder
    holder=$(kubectl -n "$OPNS" get lease tidegate-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)
    [ -n "$holder" ] && [ "$holder" != "$OLD_OPERATOR" ] && [ "$holder" = "$(operator_pod)" ]
}
wait_for "the Deployment's new operator pod holds the Lease" 120 new_leader
samples="" prev=0 ok=1
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 150 ]; do
    d=$(jp '{.status.desiredReplicas}') r=$(kubectl -n "$NS" get deploy "$POOL" -o jsonpath='{.spec.replicas}')
    samples="$samples $d/$r"
    { [ "$d" = 4 ] && [ "${r:-0}" -ge "$prev" ]; } || ok=0
    prev=${r:-0}
    [ "$(ready_engines)" = 4 ] && [ $((SECONDS - t0)) -ge 10 ] && break
    sleep 1
done
if [ "$ok" = 1 ] && [ "$(ready_engines)" = 4 ]; then
    pass "the new leader converged on 4 ready engine pods without a reversal (desired/Deployment replicas:$samples)"
else
    fail "the new leader converged on 4 ready engine pods without a reversal" "desired/replicas:$samples; ready $(ready_engines)"
fi
check_state_kept "the takeover" takeover-newcomer
kubectl -n "$NS" patch inferencepool "$POOL" --type merge -p '{"spec":{"replicas":{"max":3}}}' >/dev/null
wait_for "ceiling back to 3: an engine pod drains and leaves" 150 bash -c \
    "[ \"\$(kubectl -n $NS get deploy $POOL -o jsonpath='{.spec.replicas}')\" = 3 ] && [ \"\$(kubectl -n $NS get pods -l app.kubernetes.io/name=tidegate-engine -o name | grep -c .)\" = 3 ]"

# ---- Prometheus outage: fail static (no scale-down, MetricsAvailable=False), then recovery.
desired_before=$(jp '{.status.desiredReplicas}')
kill "$PROM_PID"
wait "$PROM_PID" 2>/dev/null
cond_status() { jp "{.status.conditions[?(@.type==\"$1\")].status}"; }
wait_for "Prometheus down: MetricsAvailable=False" 60 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"MetricsAvailable\")].status}')\" = False ]"
lowest=$desired_before
for _ in $(seq 1 12); do
    d=$(jp '{.status.desiredReplicas}')
    [ -n "$d" ] && [ "$d" -lt "$lowest" ] && lowest=$d
    sleep 1
done
[ "$lowest" -ge "$desired_before" ] && pass "no scale-down decided while metrics are missing (desired stayed $desired_before)" ||
    fail "no scale-down decided while metrics are missing" "desired $desired_before → $lowest"
pass "MetricsAvailable message: $(jp '{.status.conditions[?(@.type=="MetricsAvailable")].message}')"
if start_prometheus 0.0.0.0; then pass "Prometheus restarted"; else fail "Prometheus restarted" "$(tail -20 "$WORK/prometheus.log")"; fi
wait_for "metrics recover: MetricsAvailable=True" 90 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"MetricsAvailable\")].status}')\" = True ]"

# ---- Load gone: long streams in flight on every engine when the scale-down starts. The pod
# the operator drains gets the lowest pod-deletion-cost; the ReplicaSet must remove that one,
# and it leaves only when its streams are done. Admission reopens after the hold time.
touch "$WORK/stop-load"
wait "$LOAD_PID"
streams=()
n=$(python3 -c "import json;print(sum(len(g['targets']) for g in json.load(open('$TARGETS'))))")
for i in $(seq 0 $((n - 1))); do
    python3 e2e/load.py stream --targets "$TARGETS" --index "$i" --tokens 900 >"$WORK/stream-drain-$i.txt" 2>&1 &
    streams+=("$!")
done
before=$(engine_pods | awk '{print $1}' | sort)
# Until the first engine pod leaves: every pod marked drained (pod-deletion-cost -1000) and
# the pods gone. A later scale-down step may drain and remove another; each removed pod must
# have been marked before it went.
drained="" removed=""
t0=$SECONDS
while [ $((SECONDS - t0)) -lt 240 ]; do
    now=$(engine_pods)
    drained=$(printf '%s\n%s\n' "$drained" "$(awk '$4 == "-1000" {print $1}' <<<"$now")" | grep . | sort -u)
    removed=$(comm -23 <(echo "$before") <(awk '{print $1}' <<<"$now" | sort))
    [ -n "$removed" ] && break
    sleep 0.5
done
for i in "${!streams[@]}"; do wait "${streams[$i]}"; done
unmarked=$(comm -23 <(echo "$removed" | grep . | sort) <(echo "$drained" | grep . | sort))
if [ -n "$removed" ] && [ -z "$unmarked" ]; then
    pass "the pod the operator drained is the pod the ReplicaSet deleted ($(echo "$removed" | tr '\n' ' '); pod-deletion-cost -1000)"
else
    fail "the pod the operator drained is the one the ReplicaSet deleted" "drained: ${drained:-none marked}; removed: ${removed:-none}"
fi
ok=$(cat "$WORK"/stream-drain-*.txt | grep -c '^ok$')
lost=$(cat "$WORK"/stream-drain-*.txt | grep -vc -e '^ok$' -e '^HTTP 503$')
if [ "$ok" -ge 1 ] && [ "$lost" -eq 0 ]; then
    pass "every stream in flight when the scale-down began completed ($ok; $((${#streams[@]} - ok)) refused at start by a draining engine)"
else
    fail "streams in flight when the scale-down began completed" "$(cat "$WORK"/stream-drain-*.txt)"
fi
wait_for "admission reopens after the hold time" 120 is '{.status.admission.state}' Open

echo "       load outcomes: $(tr -d '\n ' <"$WORK/load.json")"
printf '%s\n' "${FAULTS[@]}" >"$WORK/faults.txt"
if costs=$(python3 e2e/cluster/losses.py "$WORK/load-errors.txt" "$WORK/faults.txt" --lossless router-pod-deleted --lossless template-roll); then
    pass "the load lost requests only on the engines the faults took, none to the router's deletion or the roll ($(echo "$costs" | paste -sd ';' | sed 's/;/; /g'))"
else
    fail "the load lost requests only on the engines the faults took" "$costs; $(tr '\n' ' ' <"$WORK/load-errors.txt")"
fi
grep -q '"served/existing"' "$WORK/load.json" && pass "existing tenants were served under load" || fail "existing tenants were served under load"

# ---- Events tell each step.
events=$(kubectl -n "$NS" get events --field-selector "involvedObject.kind=InferencePool,involvedObject.name=$POOL" \
    -o jsonpath='{range .items[*]}{.reason}{"\n"}{end}' 2>/dev/null | sort -u | tr '\n' ' ')
missing=""
for r in ScaledUp NewTenantsPaused MetricsUnavailable AdmissionReopened ScaledDown; do
    grep -qw "$r" <<<"$events" || missing="$missing $r"
done
[ -z "$missing" ] && pass "Events on the pool tell each step: $events" || fail "Events on the pool tell each step" "missing:$missing; got: $events"
kubectl -n "$NS" get inferencepools | sed 's/^/       | /'

# ---- Scale from zero: a pool at min 0 runs its routers and no engine. One request is held at
# a router; the operator reads the held count, scales 0 → 1, and the request is answered.
loop_zero_pool_manifest "pvc://model-weights/tiny-random" "    extraArgs: [\"--threads\", \"1\"]" \
    ", metrics: {source: Direct}" 120s | kubectl apply -f - >/dev/null
zp() { kubectl -n "$NS" get inferencepool zero -o jsonpath="$1" 2>/dev/null; }
# Ready routers are not yet reachable through the Service: its EndpointSlice must list one
# ready (kube-proxy refuses connections to a Service without endpoints).
zero_routers_up() {
    kubectl -n "$NS" rollout status deploy/zero-router --timeout=2s >/dev/null 2>&1 &&
        [ "$(kubectl -n "$NS" get deploy zero -o jsonpath='{.spec.replicas}' 2>/dev/null)" = 0 ] &&
        kubectl -n "$NS" get endpointslices -l kubernetes.io/service-name=zero \
            -o jsonpath='{.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}' 2>/dev/null | grep -q .
}
wait_for "the pool at min 0 has its routers Ready and no engine" 120 zero_routers_up
sleep 2 # kube-proxy's rules follow the EndpointSlice within its sync period
ZIP=$(kubectl -n "$NS" get service zero -o jsonpath='{.spec.clusterIP}')
printf '[{"pool": "zero", "url": "http://%s:8000"}]\n' "$ZIP" >"$WORK/zero-routers.json"
t0=$SECONDS
read -r code typ _ engine < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$WORK/zero-routers.json" \
    --tenant tenant-001 --tier standard --timeout 150)
if [ "$code" = 200 ] && [ "$(zp '{.status.replicas}')" = 1 ]; then
    pass "a request to the pool at 0 replicas was held and answered after it scaled to 1 ($((SECONDS - t0)) s, engine pod $engine)"
else
    fail "a request to a pool at 0 replicas is answered after it scales to 1" "got $code $typ; replicas $(zp '{.status.replicas}')"
fi

touch "$WORK/stop-targets"
summary
