#!/usr/bin/env bash
# Pod smoke: the engine pod a cluster would get, started as a kubelet would start it.
#
# For the example pools (the 8B pool with the random-weight model on its PVC, gpus 0 and a
# memory limit this machine has; the local demo pool with its model on a PVC):
#   1. `tidegate-operator render` prints the objects the operator applies;
#   2. `k8s-testenv validate` checks every one against the Kubernetes schemas;
#   3. e2e/kubelet.py runs the engine container of the rendered pod template as a local
#      process: its own args and env (the admin token from the rendered Secret), volume mounts
#      mapped to folders, the probes polled as declared, a chat completion on the port the
#      engines' Service targets;
#   4. then the router container of the rendered router Deployment, the same way, in front of
#      that engine: probes, an endpoint push to its admin API with the Secret's token (as the
#      operator pushes), a chat completion on the port the front-door Service targets,
#      answered with `x-tidegate-engine` naming the engine; preStop + SIGTERM: exit 0;
#   5. the engine: preStop + SIGTERM with a stream in flight: it must drain and exit 0 within
#      terminationGracePeriodSeconds.
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/lib.sh

target=${CARGO_TARGET_DIR:-target}
OPERATOR=$target/debug/tidegate-operator
ENGINE=$target/debug/tidegate-engine
build_binaries debug
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check pyyaml

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$ENGINE" gen-random-model --out "$WORK/weights/llama-3.1-8b-instruct" >/dev/null
cp -r "$WORK/weights/llama-3.1-8b-instruct" "$WORK/weights/tiny-random"

# patch_pool IN OUT PVC_URI: the example as a cluster on this machine would run it: the model
# on a PVC, no GPU, a memory limit (and offload tiers) that fit a small CI machine.
patch_pool() {
    python3 - "$1" "$2" "$3" <<'PY'
import sys, yaml
src, dst, uri = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
for d in docs:
    if d.get("kind") != "InferencePool":
        continue
    spec = d["spec"]
    spec["model"]["uri"] = uri
    eng = spec["engine"]
    eng["resources"] = dict(eng.get("resources", {}), gpus=0, memory="512Mi")
    kv = eng.setdefault("kvCache", {})
    if "hostOffload" in kv:
        kv["hostOffload"] = "64Mi"
    if "diskOffload" in kv:
        kv["diskOffload"] = "128Mi"
    spec.pop("gpuBudget", None)
yaml.safe_dump_all(docs, open(dst, "w"), sort_keys=False)
PY
}

smoke() {
    local name=$1 pool=$2 uri=$3
    shift 3
    echo "== pod smoke: $name"
    patch_pool "$pool" "$WORK/$name.pool.yaml" "$uri"
    if ! "$OPERATOR" render -f "$WORK/$name.pool.yaml" "$@" >"$WORK/$name.rendered.yaml" 2>"$WORK/$name.render.err"; then
        fail "$name: tidegate-operator render" "$(cat "$WORK/$name.render.err")"
        return
    fi
    pass "$name: tidegate-operator render ($(grep -c '^kind:' "$WORK/$name.rendered.yaml") objects)"
    check "$name: every rendered object validates against the Kubernetes schemas" \
        "$K8S_TESTENV" validate "$WORK/$name.rendered.yaml"
    local what="the engine and router containers start and serve (through the router), and stop, as the kubelet runs them"
    if python3 e2e/kubelet.py "$WORK/$name.rendered.yaml" --engine-bin "$ENGINE" \
        --volume "model=$WORK/weights" --log "$WORK/$name.engine.log" \
        --router-log "$WORK/$name.router.log" >"$WORK/$name.kubelet.out" 2>&1; then
        pass "$name: $what"
        sed 's/^/       /' "$WORK/$name.kubelet.out"
    else
        fail "$name: $what" \
            "$(cat "$WORK/$name.kubelet.out"
               echo '--- engine log (tail):'; tail -20 "$WORK/$name.engine.log"
               echo '--- router log (tail):'; tail -20 "$WORK/$name.router.log" 2>/dev/null)"
    fi
}

smoke llama-8b examples/inferencepool-llama-8b.yaml \
    pvc://model-weights/llama-3.1-8b-instruct -f examples/tierpolicy-three-tiers.yaml
smoke local-demo examples/local/pool.yaml pvc://model-weights/tiny-random -f examples/local/tiers.yaml

summary
