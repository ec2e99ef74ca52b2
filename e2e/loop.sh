#!/usr/bin/env bash
# The whole loop on real parts: a real Kubernetes API server (CRDs only), a real Prometheus
# scraping real engine processes, and the operator watching the API server with the local
# workload runtime (the test API server has no Deployments or Pods).
#
# Steps: pool min 1 / max 3 → Ready → load from several tenants, through the pool's router →
# 3 replicas → admission
# paused (kubectl shows it) → new tenant of a pausable tier 503 with the reason, existing
# tenant 200, and no tenant the pool had accepted a request of ever refused as new → an
# engine killed mid-stream (other streams finish, the pool recovers; the load
# loses no request except those in flight on it) → the operator killed while the pool is paused
# and scaling to a raised ceiling, and restarted (it adopts the engines, keeps the admission
# state and its since and every tenant, and converges without a reversal) →
# Prometheus stopped (no scale-down, MetricsAvailable=False) and restarted → load stops →
# admission reopens after the hold time → scale-down drains; in-flight streams complete →
# a second pool at 0 replicas answers one request through its router after scaling to 1.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/loop-lib.sh"
cd "$REPO_ROOT"

TARGET=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
PROFILE=${E2E_PROFILE:-debug}
OPERATOR=$TARGET/$PROFILE/tidegate-operator
ENGINE=$TARGET/$PROFILE/tidegate-engine
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-e2e-loop.XXXXXX")
NS=e2e
POOL=tide
TARGETS=$WORK/targets.json
# The pool's front door: the local runtime writes each pool's router URL here.
ROUTERS=$WORK/local/routers.json
PIDS=()

cleanup() {
    stop_background
    pkill -f "tidegate-engine serve.*$WORK" 2>/dev/null
    # Routers carry no path of $WORK on their command line: found by their port.
    for url in $(python3 -c 'import json,sys; print(" ".join(r["url"] for r in json.load(open(sys.argv[1]))))' "$ROUTERS" 2>/dev/null); do
        pkill -f -- "route --listen ${url#http://}" 2>/dev/null
    done
    stop_api_server
}

echo "== e2e loop: API server + Prometheus + engine processes + operator"
if [ ! -x "$OPERATOR" ] || [ ! -x "$ENGINE" ]; then
    log "building binaries"
    build_binaries "$PROFILE" || exit 1
fi
start_api_server "$WORK/apiserver" || exit 1
trap cleanup EXIT
check "CRDs applied and Established" apply_crds

# --- Prometheus, scraping whatever the local runtime lists in the file_sd targets file.
PROM_BIN=$(dirname "$(command -v kubectl)")/prometheus
[ -x "$PROM_BIN" ] || PROM_BIN=$(command -v prometheus)
PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo '[]' >"$TARGETS"
cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: tidegate-engines
    file_sd_configs: [{files: ["$TARGETS"], refresh_interval: 1s}]
EOF
if start_prometheus 127.0.0.1; then
    pass "Prometheus $("$PROM_BIN" --version 2>&1 | head -1 | awk '{print $3}') started (real server)"
else
    fail "Prometheus started" "$(tail -20 "$WORK/prometheus.log")"
fi

# --- The pool and its tiers.
loop_pool_manifests "file://$WORK/model" "    extraArgs: ${E2E_ENGINE_ARGS:-[]}" \
    "{source: Prometheus, prometheusUrl: \"http://127.0.0.1:$PROM_PORT\", rateWindow: 5s, staleAfter: 8s}" \
    | kubectl apply -f - >/dev/null
check "TierPolicy and InferencePool applied" kubectl -n "$NS" get inferencepool "$POOL"

"$ENGINE" gen-random-model --out "$WORK/model" >"$WORK/gen-model.log" 2>&1 ||
    fail "random model generated" "$(cat "$WORK/gen-model.log")"

# --- The operator: watches the API server, runs engines locally. Every run appends to one
# log; a step that needs only its own lines notes where they start (log_mark, log_since).
start_operator() {
    RUST_LOG=${RUST_LOG:-info} "$OPERATOR" run --workload local --namespaces "$NS" \
        --engine-bin "$ENGINE" --local-state-dir "$WORK/local" --file-sd "$TARGETS" \
        --metrics-listen 127.0.0.1:0 >>"$WORK/operator.log" 2>&1 &
    OPERATOR_PID=$!
    PIDS+=("$OPERATOR_PID")
}
log_mark() { wc -l <"$WORK/operator.log"; }
log_since() { tail -n +"$(($1 + 1))" "$WORK/operator.log"; }
start_operator

jp() { kubectl -n "$NS" get inferencepool "$POOL" -o jsonpath="$1" 2>/dev/null; }
cond() { jp "{.status.conditions[?(@.type==\"$1\")].status}"; }
# What a timed-out wait_for (lib.sh) prints: the pool's status and the operator's log tail.
wait_context() {
    kubectl -n "$NS" get inferencepool "$POOL" -o yaml | sed -n '/^status:/,$p' | head -60
    echo "--- operator log (tail):"
    tail -20 "$WORK/operator.log"
}
is() { [ "$(jp "$1")" = "$2" ]; }
ge() { [ "$(jp "$1")" -ge "$2" ] 2>/dev/null; }

# registry_tenants: the tenant ids of the pool's registry file, one a line.
registry_tenants() { python3 e2e/registry_tenants.py "$WORK/local/registry/${NS}_${POOL}.tenants.bin"; }

# kill_operator_mid_scale: raises the ceiling while paused and SIGKILLs the operator once it
# ordered the 4th replica; notes the admission since and the registry's tenants first.
kill_operator_mid_scale() {
    wait_for "paused for new tenants before the restart" 60 is '{.status.admission.state}' PausedNewTenants || return
    SINCE_BEFORE=$(jp '{.status.admission.since}')
    TENANTS_BEFORE=$(registry_tenants | sort)
    kubectl -n "$NS" patch inferencepool "$POOL" --type merge -p '{"spec":{"replicas":{"max":4}}}' >/dev/null
    local t0=$SECONDS state ready replicas
    until [ "$(jp '{.status.desiredReplicas}')" = 4 ] || [ $((SECONDS - t0)) -ge 60 ]; do sleep 0.2; done
    state=$(jp '{.status.admission.state}') ready=$(jp '{.status.readyReplicas}') replicas=$(jp '{.status.replicas}')
    kill -9 "$OPERATOR_PID"
    wait "$OPERATOR_PID" 2>/dev/null
    if [ "$(jp '{.status.desiredReplicas}')" = 4 ] && [ "$state" = PausedNewTenants ] && [ "${ready:-0}" -lt 4 ]; then
        pass "operator killed while $state and scaling 3 → 4 (desired 4, replicas $replicas, ready $ready)"
    else
        fail "operator killed while paused and mid-scale" "desired $(jp '{.status.desiredReplicas}'), state $state, replicas $replicas, ready $ready"
    fi
}

# check_restored MARK: the operator started after log line MARK adopted the engines and kept
# the admission state, its since and every tenant; the engines still apply both.
check_restored() {
    local adopted
    adopted=$(log_since "$1" | grep -m1 'adopted the engines' | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'replicas=\[[^]]*\]')
    [ -n "$adopted" ] && pass "it adopted the running engines ($adopted)" ||
        fail "it adopted the running engines" "$(log_since "$1" | head -20)"
    log_since "$1" | grep -q 'adopted the router' && pass "it adopted the running router (the pool's front door kept its address)" ||
        fail "it adopted the running router" "$(log_since "$1" | grep -i router | head -5)"
    check_state_kept "the restart" restart-newcomer
}

# check_converges MARK: desired stays 4 and the count only climbs until 4 are ready (a
# reversal would show as a lower desired or a drain in the log after MARK).
check_converges() {
    local samples="" d r ok=1 prev=0 downs t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 90 ]; do
        d=$(jp '{.status.desiredReplicas}') r=$(jp '{.status.replicas}')
        samples="$samples $d/$r"
        { [ "$d" = 4 ] && [ "$r" -ge "$prev" ]; } || ok=0
        prev=$r
        [ "$(jp '{.status.readyReplicas}')" = 4 ] && [ $((SECONDS - t0)) -ge 10 ] && break
        sleep 1
    done
    downs=$(log_since "$1" | grep -c -e 'waiting for drain' -e 'drained; scal')
    if [ "$ok" = 1 ] && [ "$downs" = 0 ] && [ "$(jp '{.status.readyReplicas}')" = 4 ]; then
        pass "converged on 4 ready replicas without a reversal (desired/replicas:$samples)"
    else
        fail "converged on 4 ready replicas without a reversal" "desired/replicas:$samples; scale-down lines: $downs; ready $(jp '{.status.readyReplicas}')"
    fi
}

wait_for "an engine comes up and the pool becomes Ready" 120 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" = True ] && [ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.readyReplicas}')\" -ge 1 ]"

register_free_tenant

# --- Load from several tenants and tiers; existing tenants first. The tiny model steps in
# about a millisecond, so how much of the load is in the pool at once is set by how long a
# request stays there against the client's own time between requests. At 32 tokens a request
# only ~10 of the 48 users were in the pool at once: 0.92-0.95 of the ceiling's capacity, a hair
# over pauseThreshold 0.9, and under it on a slower machine (no pause; a CI failure). At 96
# tokens it is over twice the ceiling's capacity.
python3 e2e/load.py run --targets "$TARGETS" --routers "$ROUTERS" --out "$WORK/load.json" --users 48 --base-users 9 \
    --tokens 96 --duration 400 --ramp-start 6 --ramp-step 0.2 --stop-file "$WORK/stop-load" \
    --errors-out "$WORK/load-errors.txt" &
LOAD_PID=$!
PIDS+=("$LOAD_PID")

wait_for "replicas grow to 3" 150 ge '{.status.replicas}' 3
wait_for "admission paused for new tenants at the ceiling" 120 is '{.status.admission.state}' PausedNewTenants
check_paused_admission "at the router"

# --- Kill an engine in the middle of a stream: the other streams finish, the pool recovers.
# The victim is found before its stream starts and killed by the stream's client at its first
# token: the tiny model streams its 900 tokens in under half a second on a fast CPU, so a kill
# from here, after polling for that token, could come after the stream ended. The stream goes
# straight at the engine (no router header), hence the "-" key of the pid file.
victim_port=$(python3 -c "import json;print(json.load(open('$TARGETS'))[0]['targets'][0].split(':')[1])")
victim_pid=$(pgrep -f -- "--listen 127.0.0.1:$victim_port" | head -1)
printf -- '- %s\n' "$victim_pid" >"$WORK/victim-pid.txt"
python3 e2e/load.py stream --targets "$TARGETS" --index 0 --tokens 900 --started-file "$WORK/victim-started" \
    --kill-on-start "$WORK/victim-pid.txt" >"$WORK/stream-victim.txt" 2>&1 &
VICTIM_STREAM=$!
python3 e2e/load.py stream --targets "$TARGETS" --index 1 --tokens 200 >"$WORK/stream-other.txt" 2>&1 &
OTHER_STREAM=$!
wait_file "$WORK/victim-started" 10 || fail "the stream on the engine to kill started" "$(cat "$WORK/stream-victim.txt")"
read -r _ killed KILLED_AT <"$WORK/victim-started" 2>/dev/null || true
if [ -n "$victim_pid" ] && [ "${killed:--}" != - ]; then
    pass "engine on :$victim_port killed mid-stream, at its first token (pid $killed)"
else
    fail "found the engine process to kill" "port $victim_port, pid '${victim_pid}'"
fi
# The router takes the dead engine out at once (a failed connect or its next probe).
wait_for "the router marks the killed engine down and sends it nothing new" 5 \
    bash -c "grep -h 'engine health changed' '$WORK'/local/logs/*router*.log 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | grep -q 'to=Down'"
wait "$OTHER_STREAM" && pass "a stream on another engine completed" || fail "a stream on another engine completed" "$(cat "$WORK/stream-other.txt")"
if wait "$VICTIM_STREAM"; then
    fail "the killed engine's own stream ended for its client without [DONE]" "it completed: killed too late"
else
    pass "the killed engine's own stream ended for its client without [DONE] ($(cat "$WORK/stream-victim.txt"))"
fi
wait_for "the pool recovers: 3 ready replicas again" 90 ge '{.status.readyReplicas}' 3

# --- Operator restart while paused and mid-scale. The ceiling goes up to 4 while new tenants
# are paused; the operator is killed (SIGKILL) once it has ordered the 4th replica and before
# its status shows it ready. The engines keep running, as a Deployment's pods outlive a
# crashed controller; the next operator adopts them (engine book), restores the admission
# state and its since from status, keeps every tenant of the registry, and converges on 4
# without a reversal. Then the ceiling goes back to 3: an adopted engine drains and leaves.
restart_step() {
    kill_operator_mid_scale || return
    RESTART_MARK=$(log_mark)
    start_operator
    if wait_for "the restarted operator reconciles" 60 \
        bash -c "tail -n +$((RESTART_MARK + 1)) '$WORK/operator.log' | grep -q 'reconciled'"; then
        check_restored "$RESTART_MARK"
        check_converges "$RESTART_MARK"
    fi
    kubectl -n "$NS" patch inferencepool "$POOL" --type merge -p '{"spec":{"replicas":{"max":3}}}' >/dev/null
    wait_for "ceiling back to 3: an adopted engine drains and leaves" 120 \
        bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.replicas}')\" = 3 ] &&
                 [ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.readyReplicas}')\" = 3 ] &&
                 tail -n +$((RESTART_MARK + 1)) '$WORK/operator.log' | grep -q 'adopted engine exited'"
}
restart_step

# --- Prometheus outage: fail static, then recovery. The load goes on: an operator that read
# "no data" as "no demand" would scale down now.
desired_before=$(jp '{.status.desiredReplicas}')
kill "$PROM_PID"
wait "$PROM_PID" 2>/dev/null
wait_for "Prometheus down: MetricsAvailable=False" 60 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"MetricsAvailable\")].status}')\" = False ]"
lowest=$desired_before
for _ in $(seq 1 12); do
    d=$(jp '{.status.desiredReplicas}')
    [ -n "$d" ] && [ "$d" -lt "$lowest" ] && lowest=$d
    sleep 1
done
[ "$lowest" -ge "$desired_before" ] && pass "no scale-down decided while metrics are missing (desired stayed $desired_before)" ||
    fail "no scale-down decided while metrics are missing" "desired $desired_before → $lowest"
msg=$(jp '{.status.conditions[?(@.type=="MetricsAvailable")].message}')
pass "MetricsAvailable message: $msg"
if start_prometheus 127.0.0.1; then pass "Prometheus restarted"; else fail "Prometheus restarted" "$(tail -20 "$WORK/prometheus.log")"; fi
wait_for "metrics recover: MetricsAvailable=True" 60 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.conditions[?(@.type==\"MetricsAvailable\")].status}')\" = True ]"

# --- Load gone: long streams are in flight on every engine when the scale-down starts; the
# engines removed drain them before leaving. Admission reopens after the hold time.
touch "$WORK/stop-load"
streams=()
n=$(python3 -c "import json;print(sum(len(g['targets']) for g in json.load(open('$TARGETS'))))")
for i in $(seq 0 $((n - 1))); do
    python3 e2e/load.py stream --targets "$TARGETS" --index "$i" --tokens 900 >"$WORK/stream-drain-$i.txt" 2>&1 &
    streams+=("$!")
done
wait "$LOAD_PID"
SCALE_DOWN_MARK=$(log_mark)
wait_for "the pool scales down" 120 bash -c "[ \"\$(kubectl -n $NS get inferencepool $POOL -o jsonpath='{.status.replicas}')\" -lt 3 ]"
for i in "${!streams[@]}"; do wait "${streams[$i]}"; done
# A stream refused at its start (503: that engine was already draining) was never in flight.
ok=$(cat "$WORK"/stream-drain-*.txt | grep -c '^ok$')
lost=$(cat "$WORK"/stream-drain-*.txt | grep -vc -e '^ok$' -e '^HTTP 503$')
if [ "$ok" -ge 1 ] && [ "$lost" -eq 0 ]; then
    pass "every stream in flight when the scale-down began completed ($ok; $((${#streams[@]} - ok)) refused at start by a draining engine)"
else
    fail "streams in flight when the scale-down began completed" "$(cat "$WORK"/stream-drain-*.txt)"
fi
# The operator logs the scale-down as done once every drained replica has left.
wait_for "the removed engines were asked to drain and left only when drained" 90 \
    bash -c "tail -n +$((SCALE_DOWN_MARK + 1)) '$WORK/operator.log' | grep -q 'drained; scal' && cat '$WORK'/local/logs/*.log | grep -q 'draining grace'"
wait_for "admission reopens after the hold time" 90 is '{.status.admission.state}' Open

echo "       load outcomes: $(tr -d '\n ' <"$WORK/load.json")"
# The only requests the load may lose are those in flight on the engine killed on purpose.
lost=$(grep -c . "$WORK/load-errors.txt" || true)
stray=$(python3 -c "
import sys
killed = float(sys.argv[1] or 0)
lines = [l.split() for l in open(sys.argv[2]) if l.strip()]
print(sum(1 for at, _ in lines if not killed - 1 <= float(at) <= killed + 5))
" "${KILLED_AT:-}" "$WORK/load-errors.txt")
[ "$stray" = 0 ] && pass "requests lost only on the killed engine ($lost, all within 5 s of the kill)" ||
    fail "requests lost only on the killed engine" "$stray of $lost lost away from the kill: $(cat "$WORK/load-errors.txt")"
grep -q '"served/existing"' "$WORK/load.json" && pass "existing tenants were served under load" || fail "existing tenants were served under load"
# Existing means existing: a tenant is existing from the moment the pool accepted one of its
# requests (into the router's queue or an engine), so no pause refuses it afterwards. The
# load tallies paused refusals of such tenants apart (`/accepted_before`).
read -r refused_after refused_paused < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
paused = {k: v for k, v in d.items() if "/new_tenant_admission_paused/" in k}
print(sum(v for k, v in paused.items() if k.endswith("/accepted_before")), sum(paused.values()))
' "$WORK/load.json")
[ "${refused_after:-x}" = 0 ] &&
    pass "no tenant the pool had accepted a request of was refused as new ($refused_paused paused refusals, all of tenants never accepted before)" ||
    fail "no tenant the pool had accepted a request of was refused as new" "$refused_after of $refused_paused paused refusals were of tenants accepted before: $(tr -d '\n ' <"$WORK/load.json")"
kubectl -n "$NS" get inferencepools | sed 's/^/       | /'
# --- Scale from zero: a pool at min 0 runs no engine, only its router. One request is held
# there; the operator reads the held count, scales 0 → 1, and the request is answered.
loop_zero_pool_manifest "file://$WORK/model" "" "" 90s | kubectl apply -f - >/dev/null
zp() { kubectl -n "$NS" get inferencepool zero -o jsonpath="$1" 2>/dev/null; }
zero_router_up() {
    python3 -c 'import json,sys; sys.exit(0 if any(r["pool"] == "zero" for r in json.load(open(sys.argv[1]))) else 1)' "$ROUTERS" 2>/dev/null &&
        [ "$(zp '{.status.replicas}')" = 0 ]
}
wait_for "the pool at min 0 has its router and no engine" 60 zero_router_up
t0=$SECONDS
read -r code typ _ engine < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --pool zero \
    --tenant tenant-001 --tier standard --timeout 120)
if [ "$code" = 200 ] && [ "$(zp '{.status.replicas}')" = 1 ]; then
    pass "a request to the pool at 0 replicas was held and answered after it scaled to 1 ($((SECONDS - t0)) s, engine $engine)"
else
    fail "a request to a pool at 0 replicas is answered after it scales to 1" \
        "got $code $typ; replicas $(zp '{.status.replicas}'); $(grep -m3 'scaling from zero' "$WORK/operator.log")"
fi
grep -q 'scaling from zero' "$WORK/operator.log" && pass "the operator logged the scale from zero" ||
    fail "the operator logged the scale from zero" "$(tail -5 "$WORK/operator.log")"

summary
