#!/usr/bin/env bash
# Model sources against real servers: a SeaweedFS S3 server (scripts/seaweedfs.sh) on
# loopback, with an access key, holding the random-weight model; local mode runs the real
# control loop with engine processes and the fetch step before them.
#   - a pool with `model.uri: s3://…` starts from the S3 server and answers a completion
#     through its router; the fetched folder has the objects, verified, and a manifest;
#   - a second start finds the model fetched and downloads nothing;
#   - a pool whose Secret holds a wrong secret key never starts an engine, and its Ready
#     condition says ModelFetchFailed with the URI and the store's refusal;
#   - a pool naming a prefix with no object says not found;
#   - `fetch-model` of an hf:// model from a Hugging Face cache laid out as the hub writes it
#     (HF_HUB_OFFLINE=1), which the engine then serves. The hub itself is not reachable here:
#     its download path is not exercised by this script.
#
# Environment: E2E_PROFILE (debug | release; default debug), CARGO_TARGET_DIR.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT" || exit 1

PROFILE=${E2E_PROFILE:-debug}
TARGET=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-e2e-sources.XXXXXX")
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
# E2E_KEEP=1 keeps the work folder (logs, state) for a look after a failure.
[ "${E2E_KEEP:-}" = 1 ] && trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; echo "kept $WORK"' EXIT

echo "== model sources: s3:// from SeaweedFS, hf:// from a Hugging Face cache"
build_binaries "$PROFILE" || exit 1
BIN="$TARGET/$PROFILE"
WEED=$(scripts/seaweedfs.sh path) || { fail "SeaweedFS builds"; summary; exit 1; }

# --- the S3 server: weed server (master, volume, filer, S3 gateway) on loopback ports.
source "$REPO_ROOT/e2e/lib/seaweedfs.sh"
start_weed "$WEED" 127.0.0.1 "$WORK/weed" PIDS
wait_context() { tail -20 "$WORK/weed/weed.log"; }
wait_for "SeaweedFS answers S3 requests with the access key" 180 weed_up || { summary; exit 1; }

"$BIN/tidegate-engine" gen-random-model --out "$WORK/tiny" >/dev/null
uploaded=$(upload_dir "$WORK/tiny" "$S3/models/tiny")
check "the random-weight model is in the bucket ($uploaded objects)" \
    bash -c "[ $uploaded -ge 3 ] && [ $uploaded -eq $(ls "$WORK/tiny" | wc -l) ]"

# --- pools: one with the right key, one with a wrong one, one with a missing prefix.
pool() { # NAME URI SECRET_NAME
    cat <<EOF
---
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: $1, namespace: e2e}
spec:
  model:
    name: tiny
    uri: "$2"
    source: {credentialsSecret: $3, endpoint: "$S3", region: $S3_REGION}
  engine:
    image: tidegate-engine:local
    resources: {gpus: 0, memory: 256Mi}
    kvCache: {memoryFraction: 0.2}
    extraArgs: ["--threads", "1"]
  replicas: {min: 1, max: 1}
  scaling: {interval: 1s, metrics: {source: Direct, rateWindow: 5s, staleAfter: 30s}}
EOF
}
secret() { # NAME SECRET_KEY
    cat <<EOF
---
apiVersion: v1
kind: Secret
metadata: {name: $1, namespace: e2e}
stringData: {AWS_ACCESS_KEY_ID: $S3_ACCESS, AWS_SECRET_ACCESS_KEY: $2}
EOF
}
mkdir -p "$WORK/good" "$WORK/bad"
{ secret s3-creds "$S3_SECRET"; pool from-s3 "s3://models/tiny" s3-creds; } >"$WORK/good/pool.yaml"
{ secret wrong-creds "not-the-secret-key"; pool wrong-key "s3://models/tiny" wrong-creds
  secret s3-creds "$S3_SECRET"; pool no-such-prefix "s3://models/absent" s3-creds; } >"$WORK/bad/pool.yaml"

# run_local DIR STATE OUT: local mode on DIR's manifests, in the background, no load.
run_local() {
    # The runtime's info lines name the router's port; the fetch step logs its progress.
    RUST_LOG=warn,tidegate_operator::workload_runtime=info,tidegate_fetch=info \
        "$BIN/tidegate-operator" local -f "$1" --engine-bin "$BIN/tidegate-engine" --no-load \
        --state-dir "$2" >"$3" 2>&1 &
    LOCAL_PID=$!
    PIDS+=("$LOCAL_PID")
}
stop_local() { kill -INT "$LOCAL_PID" 2>/dev/null; wait "$LOCAL_PID" 2>/dev/null; }
# The router's API port, from the runtime's log line (colours stripped).
router_port() { sed 's/\x1b\[[0-9;]*m//g' "$1" | sed -n 's/.*router started.* api=\([0-9]*\).*/\1/p' | tail -1; }
complete() { # PORT
    curl -sf "http://127.0.0.1:$1/v1/completions" -H 'content-type: application/json' \
        -d '{"model": "tiny", "prompt": "hello", "max_tokens": 4}' | grep -q '"choices"'
}

OUT="$WORK/good.out"
run_local "$WORK/good" "$WORK/state" "$OUT"
wait_context() { tail -30 "$OUT"; tail -20 "$WORK"/state/logs/*fetch.log 2>/dev/null; }
wait_for "the s3:// pool's engine is ready (fetched, then started)" 180 \
    grep -Eq '^[0-9]+s +from-s3 +tiny +1 ' "$OUT"
port=$(router_port "$OUT")
wait_for "a completion through the pool's router, from the model fetched over S3" 30 complete "$port"
dest=$(ls -d "$WORK"/state/models/s3-models-tiny-* 2>/dev/null | head -1)
check "the fetched folder holds every object and the manifest" \
    bash -c "[ -f '$dest/.tidegate-fetch.json' ] && diff -r -x .tidegate-fetch.json '$WORK/tiny' '$dest'"
check "the fetch logged each object verified" grep -q "downloaded and verified" "$WORK"/state/logs/e2e.from-s3.fetch.log
stop_local

run_local "$WORK/good" "$WORK/state" "$OUT.2"
wait_for "a second start finds the model fetched and starts the engine" 120 \
    grep -Eq '^[0-9]+s +from-s3 +tiny +1 ' "$OUT.2"
check "nothing was downloaded again" bash -c \
    "grep -q 'already fetched' '$WORK/state/logs/e2e.from-s3.fetch.log' && ! grep -q 'downloaded and verified' '$WORK/state/logs/e2e.from-s3.fetch.log'"
stop_local

OUT="$WORK/bad.out"
run_local "$WORK/bad" "$WORK/state-bad" "$OUT"
wait_context() { tail -30 "$OUT"; }
wait_for "a wrong secret key: Ready=False, ModelFetchFailed, naming the URI and the refusal" 90 \
    grep -Eq 'e2e/wrong-key condition Ready=False ModelFetchFailed: .*model fetch failed: s3://models/tiny: credentials refused' "$OUT"
grep -m1 'e2e/wrong-key condition Ready=False ModelFetchFailed' "$OUT" | sed 's/^/       | /'
wait_for "a prefix with no object: Ready=False, ModelFetchFailed, not found" 60 \
    grep -Eq 'e2e/no-such-prefix condition Ready=False ModelFetchFailed: .*s3://models/absent: not found' "$OUT"
check "no engine started for either" bash -c "! ls '$WORK'/state-bad/logs/e2e.wrong-key-0.log '$WORK'/state-bad/logs/e2e.no-such-prefix-0.log 2>/dev/null | grep -q ."
stop_local

# --- hf:// from a Hugging Face cache folder laid out as the hub writes it, offline.
HF="$WORK/hf"
COMMIT=0123456789abcdef0123456789abcdef01234567
REPO_DIR="$HF/hub/models--tidegate--tiny-random"
mkdir -p "$REPO_DIR/blobs" "$REPO_DIR/refs" "$REPO_DIR/snapshots/$COMMIT"
for f in "$WORK/tiny"/*; do
    id=$(sha256sum "$f" | cut -d' ' -f1)
    cp "$f" "$REPO_DIR/blobs/$id"
    ln -s "../../blobs/$id" "$REPO_DIR/snapshots/$COMMIT/$(basename "$f")"
done
printf '%s' "$COMMIT" >"$REPO_DIR/refs/main"
HF_HOME="$HF" HF_HUB_OFFLINE=1 "$BIN/tidegate-engine" fetch-model --uri hf://tidegate/tiny-random \
    --dest "$WORK/hf-model" >"$WORK/hf.out" 2>&1
check "fetch-model resolves hf://tidegate/tiny-random@main in the cache, offline" \
    bash -c "[ \"\$(readlink '$WORK/hf-model')\" = '$REPO_DIR/snapshots/$COMMIT' ]"
check "the engine loads the cached snapshot" \
    bash -c "'$BIN/tidegate-engine' chat --model '$WORK/hf-model' --prompt hi --max-tokens 2 >/dev/null"
HF_HOME="$HF" HF_HUB_OFFLINE=1 "$BIN/tidegate-engine" fetch-model --uri hf://tidegate/tiny-random@v2 \
    --dest "$WORK/hf-v2" >"$WORK/hf2.out" 2>&1
check "a revision the cache lacks fails, naming it" grep -q 'hf://tidegate/tiny-random@v2: not in the Hugging Face cache' "$WORK/hf2.out"
summary
