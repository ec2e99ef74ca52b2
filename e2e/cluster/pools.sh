# shellcheck shell=bash
# Sourced by e2e/cluster.sh: the example pools (applied by the quickstart) serve from pods.
# Every engine and router pod must become Ready by its own probes, a chat completion sent to
# each pool's ClusterIP Service must be answered through a router by an engine, a pod must
# reach a pool by its DNS name, and `kubectl get inferencepools` must show the live figures.
echo "== the example pools, from pods"
ENGINE_BIN=${CARGO_TARGET_DIR:-target}/${TIDEGATE_IMAGE_PROFILE:-debug}/tidegate-engine
POOLS=(inference/smollm2-chat local/demo)

# What the operator will apply, reviewed as docs/operations.md says (`render`), is admitted by
# the real API server as it stands (server-side dry run: defaulting, validation, admission).
OPERATOR_BIN=${CARGO_TARGET_DIR:-target}/${TIDEGATE_IMAGE_PROFILE:-debug}/tidegate-operator
for f in examples/cluster/smollm2-pool.yaml examples/cluster/demo-pool.yaml; do
    if "$OPERATOR_BIN" render -f "$f" >"$WORK/rendered.yaml" 2>"$WORK/render.err" \
        && kubectl apply --dry-run=server -f "$WORK/rendered.yaml" >"$WORK/render-dry-run.txt" 2>&1; then
        pass "tidegate-operator render -f $f: $(grep -c 'server dry run' "$WORK/render-dry-run.txt") objects admitted by the API server (dry run)"
    else
        fail "tidegate-operator render -f $f | kubectl apply --dry-run=server" \
            "$(cat "$WORK/render.err" "$WORK/render-dry-run.txt" 2>/dev/null | tail -10)"
    fi
done
claims_bound() {
    [ "$(kubectl get pvc -A -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | sort -u)" = Bound ]
}
wait_for "the model claims are Bound to their PersistentVolumes" 60 claims_bound

# rollout POOL: the engine and router Deployments of one pool are available.
rollout() {
    local ns=${1%/*} name=${1#*/}
    kubectl -n "$ns" rollout status "deploy/$name" --timeout=5s >/dev/null 2>&1 \
        && kubectl -n "$ns" rollout status "deploy/$name-router" --timeout=5s >/dev/null 2>&1
}
for pool in "${POOLS[@]}"; do
    wait_for "$pool: the engine and router pods are Running and Ready by their probes" 300 rollout "$pool"
done

# pool_column POOL FIELD: a field of the pool's status, as the printer columns read it.
pool_field() { kubectl -n "${1%/*}" get inferencepool "${1#*/}" -o jsonpath="{$2}" 2>/dev/null; }
pool_ready() { [ "$(pool_field "$1" .status.readyReplicas)" = 1 ] && [ "$(pool_field "$1" .status.admission.state)" = Open ]; }
for pool in "${POOLS[@]}"; do
    wait_for "$pool: status says 1 ready replica and admission Open" 120 pool_ready "$pool"
done

# chat POOL HEADER...: a chat completion to the pool's Service (ClusterIP, port http) from
# this host through kube-proxy; prints the engine that answered (x-tidegate-engine).
chat() {
    local pool=$1
    shift
    local ns=${pool%/*} name=${pool#*/} ip port model headers
    ip=$(kubectl -n "$ns" get service "$name" -o jsonpath='{.spec.clusterIP}')
    port=$(kubectl -n "$ns" get service "$name" -o jsonpath='{.spec.ports[?(@.name=="http")].port}')
    model=$(pool_field "$pool" .spec.model.name)
    headers=$(mktemp)
    local hdr=()
    for h in "$@"; do hdr+=(-H "$h"); done
    if ! curl -sf --max-time 120 -D "$headers" -o "$WORK/chat.json" "http://$ip:$port/v1/chat/completions" \
        -H 'content-type: application/json' "${hdr[@]}" \
        -d "{\"model\": \"$model\", \"max_tokens\": 16, \"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}]}"; then
        rm -f "$headers"
        return 1
    fi
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]; assert c is not None' "$WORK/chat.json" || return 1
    tr -d '\r' <"$headers" | awk -F': ' 'tolower($1) == "x-tidegate-engine" {print $2}'
    rm -f "$headers"
}
# engine_pods POOL: the pool's engine pod names.
engine_pods() {
    kubectl -n "${1%/*}" get pods -l "app.kubernetes.io/name=tidegate-engine,tidegate.dev/pool=${1#*/}" \
        -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'
}
check_chat() {
    local pool=$1 who=$2
    shift 2
    local engine
    if engine=$(chat "$pool" "$@") && [ -n "$engine" ] && engine_pods "$pool" | grep -qx "$engine"; then
        pass "$pool: a chat completion to Service ${pool#*/} (ClusterIP) as $who is answered through a router by engine pod $engine"
    else
        fail "$pool: a chat completion to Service ${pool#*/} (ClusterIP) as $who" \
            "answered by: '${engine:-}' (engine pods: $(engine_pods "$pool" | tr '\n' ' '))
$(cat "$WORK/chat.json" 2>/dev/null | head -5)"
    fi
}
check_chat inference/smollm2-chat "tenant acme (API key)" "authorization: Bearer example-acme-enterprise-key"
check_chat local/demo "tenant e2e (gateway headers)" "x-tidegate-tenant: e2e" "x-tidegate-tier: standard"

# Cluster DNS: the pool's Service by name, from CoreDNS at the address every pod's
# resolv.conf names (the kubelet's clusterDNS), and that address in a pool pod's resolv.conf.
dns_ip=$(kubectl -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')
svc_ip=$(kubectl -n inference get service smollm2-chat -o jsonpath='{.spec.clusterIP}')
check "cluster DNS ($dns_ip): smollm2-chat.inference.svc.cluster.local is $svc_ip" bash -c \
    "python3 e2e/cluster/dns_query.py $dns_ip smollm2-chat.inference.svc.cluster.local | grep -qx $svc_ip"
pod_resolv_conf() {
    local pid
    for pid in $(pgrep -x tidegate-engine); do
        grep -qs kubepods "/proc/$pid/cgroup" && cat "/proc/$pid/root/etc/resolv.conf" && return 0
    done
    return 1
}
check "a pool pod's resolv.conf names the cluster DNS and its search domains" bash -c \
    "$(declare -f pod_resolv_conf); pod_resolv_conf | grep -q 'nameserver $dns_ip' && pod_resolv_conf | grep -q 'svc.cluster.local'"

# Some load, so that the measured figures are live: a few completions on each pool.
for i in 1 2 3 4; do
    chat inference/smollm2-chat "authorization: Bearer example-globex-standard-key" >/dev/null 2>&1 || true
    chat local/demo "x-tidegate-tenant: e2e-$i" "x-tidegate-tier: free" >/dev/null 2>&1 || true
done
tokens_live() {
    local t
    t=$(pool_field "$1" .status.measured.decodeTokensPerSecond)
    [ -n "$t" ] && python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0 else 1)' "$t"
}
for pool in "${POOLS[@]}"; do
    wait_for "$pool: kubectl get inferencepools shows live TOKENS/S" 90 tokens_live "$pool"
done
echo "   kubectl get inferencepools -A:"
kubectl get inferencepools.tidegate.dev -A | sed 's/^/       /'
echo "   kubectl get inferencepools,deploy,pods -A -o wide (mid-run):"
kubectl get inferencepools.tidegate.dev,deploy,pods -A -o wide | sed 's/^/       /'

# The engine sized its KV pool within what its container can have: it read its own cgroup's
# memory limit (the pod's), and said which bound applied.
engine=$(engine_pods inference/smollm2-chat | head -1)
limit=$(kubectl -n inference get pod "$engine" -o jsonpath='{.spec.containers[0].resources.limits.memory}')
why=$(kubectl -n inference logs "$engine" 2>/dev/null | grep -o '"why":"[^"]*"' | head -1)
if grep -q "cgroup memory limit 1024.0 MiB" <<<"$why"; then
    pass "inference/smollm2-chat: the engine sized its KV pool within its container (limit $limit), read from its cgroup: $why"
else
    fail "inference/smollm2-chat: the engine's KV sizing names its cgroup's memory limit ($limit)" \
        "${why:-$(kubectl -n inference logs "$engine" 2>&1 | head -20)}"
fi

# An engine pod deleted with a stream in flight (a kubelet's termination, for real): the preStop sleep, then SIGTERM; the engine drains, the stream finishes with
# [DONE], the container exits 0 within terminationGracePeriodSeconds, and the ReplicaSet
# replaces the pod.
drain_pool=inference/smollm2-chat
victim=$(engine_pods "$drain_pool" | head -1)
grace=$(kubectl -n inference get pod "$victim" -o jsonpath='{.spec.terminationGracePeriodSeconds}')
ip=$(kubectl -n inference get service smollm2-chat -o jsonpath='{.spec.clusterIP}')
curl -sN --max-time 180 "http://$ip:8000/v1/chat/completions" -H 'content-type: application/json' \
    -H 'authorization: Bearer example-acme-enterprise-key' \
    -d '{"model": "smollm2-135m-instruct", "max_tokens": 96, "stream": true, "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]}' \
    >"$WORK/stream.txt" 2>&1 &
stream_pid=$!
first_token() { grep -q '^data: {' "$WORK/stream.txt"; }
wait_until_quiet() { local t0=$SECONDS; until "$@" || [ $((SECONDS - t0)) -ge 60 ]; do sleep 0.2; done; }
wait_until_quiet first_token
# Record the container's exit code as the kubelet reports it, until the pod object is gone.
# The terminated state can last less than one poll before the pod is removed, so a watch
# records every update of the pod as well (its last one is the deletion, with that state).
kubectl -n inference get pod "$victim" -w \
    -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}{"\n"}' \
    >"$WORK/exit-watch" 2>/dev/null &
exit_watch_pid=$!
(
    code=""
    while out=$(kubectl -n inference get pod "$victim" -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}' 2>/dev/null); do
        [ -n "$out" ] && code=$out
        sleep 0.2
    done
    echo "$code" >"$WORK/exit-code"
) &
watch_pid=$!
sleep 1
t0=$SECONDS
kubectl -n inference delete pod "$victim" --wait=false >/dev/null
wait "$stream_pid" || true
wait "$watch_pid" || true
took=$((SECONDS - t0))
sleep 1
kill "$exit_watch_pid" 2>/dev/null || true
wait "$exit_watch_pid" 2>/dev/null || true
if [ -z "$(cat "$WORK/exit-code" 2>/dev/null)" ]; then
    { grep -v '^$' "$WORK/exit-watch" || true; } | tail -1 >"$WORK/exit-code"
fi
if tail -3 "$WORK/stream.txt" | grep -q '^data: \[DONE\]'; then
    pass "$drain_pool: a stream in flight when its engine pod was deleted finished ([DONE], $(grep -c '^data: {' "$WORK/stream.txt") chunks)"
else
    fail "$drain_pool: a stream in flight when its engine pod was deleted finished" "$(tail -5 "$WORK/stream.txt")"
fi
check "$drain_pool: the deleted engine exited 0 (exit code $(cat "$WORK/exit-code" 2>/dev/null)) and was gone within terminationGracePeriodSeconds ${grace}s (${took}s)" \
    bash -c "[ \"$(cat "$WORK/exit-code" 2>/dev/null)\" = 0 ] && [ $took -le $grace ]"
wait_for "$drain_pool: the ReplicaSet replaced it, Ready by its probes" 180 rollout "$drain_pool"
wait_for "$drain_pool: status says 1 ready replica again" 120 pool_ready "$drain_pool"

# A model shipped as an OCI image: packaged here (no registry), loaded into the node's
# containerd, and mounted by the kubelet as an image volume; the pod answers a chat completion.
echo "== a model as an OCI image (image volume)"
MODEL_IMAGE=tidegate.local/models/smollm2-135m:q4_1
GGUF=$(ls models/smollm2/*.gguf | head -1)
if python3 scripts/cluster/images/oci-image.py --out "$WORK/model-image.tar" --name "$MODEL_IMAGE" \
    --file "$GGUF:/$(basename "$GGUF")" && bash "$CLUSTER" load "$WORK/model-image.tar" >/dev/null; then
    pass "the SmolLM2 GGUF file packaged as image $MODEL_IMAGE ($(du -m "$WORK/model-image.tar" | cut -f1) MiB) and loaded into the node"
else
    fail "packaging the model as an OCI image and loading it"
fi
OCI_POOL=examples/cluster/oci-model/smollm2-oci-pool.yaml
if "$OPERATOR_BIN" render -f "$OCI_POOL" 2>/dev/null | grep -A3 '^ *- image:$' | grep -q "reference: $MODEL_IMAGE"; then
    pass "tidegate-operator render shows the model's image volume"
else
    fail "tidegate-operator render shows the model's image volume" "$("$OPERATOR_BIN" render -f "$OCI_POOL" 2>&1 | grep -B2 -A4 'name: model' | head -20)"
fi
check "kubectl apply -f $OCI_POOL" kubectl apply -f "$OCI_POOL"
wait_for "inference/smollm2-oci: the engine pod mounts the image volume and turns Ready" 240 rollout inference/smollm2-oci
volume=$(kubectl -n inference get deploy smollm2-oci -o jsonpath='{.spec.template.spec.volumes[?(@.name=="model")].image.reference}')
[ "$volume" = "$MODEL_IMAGE" ] && pass "its Deployment mounts volume model from image $volume" ||
    fail "its Deployment mounts the model's image volume" "volume model: '$volume'"
check_chat inference/smollm2-oci "tenant acme (model from an image)" "authorization: Bearer example-acme-enterprise-key"
kubectl delete -f "$OCI_POOL" --wait=true >/dev/null 2>&1 || true
oci_pods_gone() { [ -z "$(kubectl -n inference get pods -l tidegate.dev/pool=smollm2-oci -o name 2>/dev/null)" ]; }
wait_for "inference/smollm2-oci deleted: its pods are gone" 90 oci_pods_gone
