#!/usr/bin/env bash
# The pool router's benchmark figures (issue: pool router), each printed with what it measured:
#
#   sessions  returning sessions with a 1,000-word history at 3 engines: median time to first
#             token through the router (session affinity) vs round-robin straight to the
#             engines (a plain Service). Serves SmolLM2 (models/smollm2) when it is there,
#             else the random-weight model; the output says which.
#   overhead  the router's added p50/p99 per request at 1,000 requests/s on loopback, against
#             an engine serving the fake model (one-token answers), A/B alternated.
#   overload  4x what two small fake engines serve, through the router, for 60 s: answers by
#             status, refusals with Retry-After, and the router's resident memory over the run.
#   fairness  two fake engines (8 slots in all), one tier: 8 tenants with one stream each,
#             alone, then beside one tenant with 48 streams: the light tenants' TTFT p50/p90.
#   starvation  48 streams of the top tier saturate the same 8 slots while one stream of the
#             lowest tier sends: its worst wait against the bound the fair queue states.
#   replicas  two routers started as the operator starts them (--limit-share 2) in front of
#             one fake engine (batch 4, queue 4) at 4x its slots: the engine's queue_full count.
#
# Usage: scripts/bench-router.sh [sessions|overhead|overload|fairness|starvation|replicas|all]
#        (default: all)
# Environment: CARGO_TARGET_DIR; BENCH_MODEL (a model directory for `sessions`).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-all}" in
    sessions | overhead | overload | fairness | starvation | replicas | all) MODE=${1:-all} ;;
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "unknown mode ${1}: expected sessions, overhead, overload, fairness, starvation, replicas or all" >&2
        exit 2
        ;;
esac

echo "building tidegate-engine (release)…" >&2
cargo build --release --quiet -p tidegate-engine
BIN=${CARGO_TARGET_DIR:-target}/release/tidegate-engine
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-bench-router.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_ready() {
    for _ in $(seq 1 600); do
        curl -sf "$1/readyz" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "not ready: $1" >&2
    return 1
}

# start_engine LOG ARGS…: an engine on a free port; prints its URL.
start_engine() {
    local log=$1 port
    shift
    port=$(free_port)
    "$BIN" serve --listen "127.0.0.1:$port" --admin-disabled "$@" >"$WORK/$log" 2>&1 &
    PIDS+=("$!")
    echo "http://127.0.0.1:$port"
}

# start_router LOG ENGINE_URL…: a router in front of the engines; sets ROUTER and ROUTER_PID.
start_router() {
    local log=$1 port args=()
    shift
    for e in "$@"; do args+=(--endpoint "$e"); done
    port=$(free_port)
    "$BIN" route --listen "127.0.0.1:$port" --admin-disabled "${args[@]}" $ROUTER_ARGS >"$WORK/$log" 2>&1 &
    ROUTER_PID=$!
    PIDS+=("$ROUTER_PID")
    ROUTER="http://127.0.0.1:$port"
    wait_ready "$ROUTER"
}

stop_all() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
}

sessions() {
    local model=${BENCH_MODEL:-models/smollm2} name
    if [ ! -e "$model" ]; then
        model=$WORK/random-model
        "$BIN" gen-random-model --out "$model" >/dev/null
    fi
    name=$(basename "$model")
    echo "== sessions: 3 engines serving $model"
    local engines=()
    for i in 0 1 2; do
        engines+=("$(start_engine "engine-$i.log" --model "$model" --served-model-name "$name" \
            --max-batch-size 4 --max-context-tokens 4096)")
    done
    for e in "${engines[@]}"; do wait_ready "$e"; done
    ROUTER_ARGS="" start_router router.log "${engines[@]}"
    local eargs=()
    for e in "${engines[@]}"; do eargs+=(--engine "$e"); done
    "$BIN" bench-router --mode sessions --router "$ROUTER" "${eargs[@]}" --model "$name" \
        --sessions "${BENCH_SESSIONS:-8}" --turns 4 --history-words 1000
    stop_all
}

overhead() {
    echo "== overhead: 1 fake engine (one-token answers), 1000 req/s"
    local e
    e=$(start_engine engine.log --fake-model --max-batch-size 256 --max-queued-requests 4096 \
        --fake-token-delay 1ms)
    wait_ready "$e"
    ROUTER_ARGS="--engine-slots 4096" start_router router.log "$e"
    "$BIN" bench-router --mode overhead --router "$ROUTER" --engine "$e" --rate 1000 \
        --duration "${BENCH_PHASE:-10s}" --rounds "${BENCH_ROUNDS:-3}"
    stop_all
}

overload() {
    echo "== overload: 2 fake engines serving about 50 req/s together; 200 req/s for 60 s"
    local a b
    a=$(start_engine engine-a.log --fake-model --max-batch-size 4 --max-queued-requests 8 --fake-token-delay 20ms)
    b=$(start_engine engine-b.log --fake-model --max-batch-size 4 --max-queued-requests 8 --fake-token-delay 20ms)
    wait_ready "$a"
    wait_ready "$b"
    ROUTER_ARGS="--engine-slots 12 --max-queued-requests 64" start_router router.log "$a" "$b"
    "$BIN" bench-router --mode overload --router "$ROUTER" --rate 200 --duration 60s \
        --max-tokens 8 --router-pid "$ROUTER_PID"
    stop_all
}

# Two tiers, tenants named by the gateway headers (x-tidegate-tenant, x-tidegate-tier): the
# top one refuses past 500 ms in the queue, the low one waits up to 30 s.
write_policy() {
    cat >"$WORK/policy.json" <<'JSON'
{"tierPolicy": {
  "tiers": [
    {"name": "enterprise", "priority": 100, "queueWaitTarget": "500ms", "maxOutputTokens": 64},
    {"name": "free", "priority": 10, "queueWaitTarget": "30s", "maxOutputTokens": 64}
  ],
  "defaultTier": "free",
  "tenancy": {"gatewayHeaders": {}}
}}
JSON
}

# two_small_engines: two fake engines of batch 4 (10 ms a token); sets A and B.
two_small_engines() {
    A=$(start_engine engine-a.log --fake-model --max-batch-size 4 --max-queued-requests 4 --fake-token-delay 10ms)
    B=$(start_engine engine-b.log --fake-model --max-batch-size 4 --max-queued-requests 4 --fake-token-delay 10ms)
    wait_ready "$A"
    wait_ready "$B"
}

fairness() {
    echo "== fairness: 2 fake engines, 8 slots in all, one tier, 16-token answers"
    write_policy
    two_small_engines
    ROUTER_ARGS="--engine-slots 4 --policy-file $WORK/policy.json" start_router router.log "$A" "$B"
    "$BIN" bench-router --mode fairness --router "$ROUTER" --tier free --max-tokens 16 \
        --light-tenants 8 --heavy-streams 48 --duration "${BENCH_PHASE:-10s}"
    stop_all
}

starvation() {
    echo "== starvation: 48 enterprise streams (priority 100, 500 ms target) over 8 slots, 1 free stream (priority 10)"
    write_policy
    two_small_engines
    ROUTER_ARGS="--engine-slots 4 --policy-file $WORK/policy.json" start_router router.log "$A" "$B"
    # Bound: (100 - 10) / 20 points/s + 0.5 s (the enterprise target) = 5 s, plus one
    # answer's time (16 tokens at 10 ms, about 0.2 s) for a slot to free.
    "$BIN" bench-router --mode starvation --router "$ROUTER" --tier free --top-tier enterprise \
        --max-tokens 16 --heavy-streams 48 --duration "${BENCH_STARVE:-30s}" --bound 5.2s
    stop_all
}

replicas() {
    echo "== replicas: 2 routers (--engine-slots 8 --limit-share 2) in front of 1 fake engine (batch 4, queue 4), 32 streams"
    write_policy
    local e r1
    e=$(start_engine engine.log --fake-model --max-batch-size 4 --max-queued-requests 4 --fake-token-delay 10ms)
    wait_ready "$e"
    ROUTER_ARGS="--engine-slots 8 --limit-share 2 --policy-file $WORK/policy.json" start_router router-1.log "$e"
    r1=$ROUTER
    ROUTER_ARGS="--engine-slots 8 --limit-share 2 --policy-file $WORK/policy.json" start_router router-2.log "$e"
    "$BIN" bench-router --mode replicas --router "$r1" --other-router "$ROUTER" --engine "$e" \
        --tier free --max-tokens 16 --heavy-streams 32 --duration "${BENCH_PHASE:-10s}"
    stop_all
}

case "$MODE" in
    all) sessions; overhead; overload; fairness; starvation; replicas ;;
    *) "$MODE" ;;
esac
