# shellcheck shell=bash
# Sourced by e2e/cluster.sh after the example pools: a pool whose model comes from S3, on the
# real cluster. A SeaweedFS S3 server (scripts/seaweedfs.sh) listens on the node's address,
# which pods reach; it holds the random-weight model under s3://models/tiny.
#   - a pool with `model.uri: s3://models/tiny` and a Secret with the key pair: the engine
#     pod's fetch-model init container downloads it into the pod's model cache, the engine
#     becomes Ready, and a chat completion through the pool's Service is answered;
#   - a pool whose Secret holds a wrong secret key: no engine starts, and the pool's Ready
#     condition is False with reason ModelFetchFailed, naming the URI and the refusal.
# The namespace and the S3 server are gone at the end (the host check after `down` needs it).
echo "== a pool whose model comes from S3 (SeaweedFS on the node's address)"
source e2e/lib/seaweedfs.sh
S3_NS=e2e-s3
S3_PIDS=()
weed_bin=$(scripts/seaweedfs.sh path 2>"$WORK/weed-path.err") || weed_bin=""
node_addr=$(kubectl get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
s3_ready=0
if [ -n "$weed_bin" ] && [ -n "$node_addr" ]; then
    start_weed "$weed_bin" "$node_addr" "$WORK/weed" S3_PIDS
    wait_context() { tail -20 "$WORK/weed/weed.log"; }
    wait_for "SeaweedFS answers S3 requests on the node's address ($node_addr)" 180 weed_up \
        && s3_ready=1
else
    fail "SeaweedFS and the node's address" "weed: ${weed_bin:-none} ($(cat "$WORK/weed-path.err")); node address: ${node_addr:-none}"
fi

s3_pool() { # NAME SECRET_NAME
    cat <<YAML
---
apiVersion: tidegate.dev/v1alpha1
kind: InferencePool
metadata: {name: $1, namespace: $S3_NS}
spec:
  model:
    name: tiny
    uri: s3://models/tiny
    source: {credentialsSecret: $2, endpoint: "$S3", region: $S3_REGION}
  engine:
    image: tidegate-engine:local
    resources: {gpus: 0, memory: 256Mi}
    kvCache: {memoryFraction: 0.2}
    extraArgs: ["--threads", "1"]
  replicas: {min: 1, max: 1}
  router: {replicas: 1}
  scaling: {interval: 2s, metrics: {source: Direct, rateWindow: 10s, staleAfter: 30s}}
YAML
}
s3_secret() { # NAME SECRET_KEY
    cat <<YAML
---
apiVersion: v1
kind: Secret
metadata: {name: $1, namespace: $S3_NS}
stringData: {AWS_ACCESS_KEY_ID: $S3_ACCESS, AWS_SECRET_ACCESS_KEY: $2}
YAML
}

if [ "$s3_ready" = 1 ]; then
    "$ENGINE_BIN" gen-random-model --out "$WORK/s3-tiny" >/dev/null
    uploaded=$(upload_dir "$WORK/s3-tiny" "$S3/models/tiny")
    check "the random-weight model is in the bucket ($uploaded objects)" \
        bash -c "[ $uploaded -ge 3 ] && [ $uploaded -eq $(ls "$WORK/s3-tiny" | wc -l) ]"
    # One pool at a time, one router each: the single node is already running the example
    # pools, and two more pools with two routers each left router pods Pending.
    {
        printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n' "$S3_NS"
        s3_secret s3-creds "$S3_SECRET"
        s3_pool from-s3 s3-creds
    } >"$WORK/s3-pool.yaml"
    {
        s3_secret wrong-creds not-the-secret-key
        s3_pool wrong-key wrong-creds
    } >"$WORK/s3-wrong-key.yaml"
    check "the S3 pool and its Secret are applied" kubectl apply -f "$WORK/s3-pool.yaml"
    wait_context() {
        kubectl -n "$S3_NS" get pods -o wide 2>&1 | tail -10
        kubectl -n "$S3_NS" get events --sort-by=.lastTimestamp 2>&1 | tail -10
        tail -5 "$WORK/weed/weed.log"
    }
    wait_for "$S3_NS/from-s3: fetched by its init container, the engine and router pods Ready" 300 \
        rollout "$S3_NS/from-s3"
    wait_for "$S3_NS/from-s3: status says 1 ready replica and admission Open" 120 pool_ready "$S3_NS/from-s3"
    check_chat "$S3_NS/from-s3" "a tenant (gateway headers)" "x-tidegate-tenant: e2e"
    pool_gone() { [ -z "$(kubectl -n "$S3_NS" get pods -o name 2>/dev/null)" ]; }
    kubectl -n "$S3_NS" delete inferencepool from-s3 >/dev/null 2>&1
    wait_for "$S3_NS/from-s3 deleted: its pods are gone" 120 pool_gone
    check "the pool with a wrong secret key and its Secret are applied" kubectl apply -f "$WORK/s3-wrong-key.yaml"
    fetch_failed() {
        kubectl -n "$S3_NS" get inferencepool wrong-key \
            -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}' \
            >"$WORK/wrong-key.cond" 2>/dev/null
        grep -Eq '^False ModelFetchFailed: .*s3://models/tiny: credentials refused' "$WORK/wrong-key.cond"
    }
    wait_for "$S3_NS/wrong-key: Ready=False, ModelFetchFailed, naming the URI and the refusal" 240 fetch_failed
    sed 's/^/       | /' "$WORK/wrong-key.cond"
    no_ready_engine() {
        [ "$(kubectl -n "$S3_NS" get deploy wrong-key -o jsonpath='{.status.readyReplicas}' 2>/dev/null)" = "" ]
    }
    check "$S3_NS/wrong-key: no engine became ready" no_ready_engine
    kubectl delete namespace "$S3_NS" --wait=true --timeout=120s >/dev/null 2>&1 \
        || echo "   (namespace $S3_NS not gone in 120 s)"
fi
for p in "${S3_PIDS[@]}"; do kill "$p" 2>/dev/null; done
wait "${S3_PIDS[@]}" 2>/dev/null || true
wait_context() { :; }
