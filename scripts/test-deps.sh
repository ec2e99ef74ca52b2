#!/usr/bin/env bash
# What scripts/test.sh needs, on a fresh Debian machine, installed once (a second run finds it
# all in place in seconds; big builds are cached under ~/.cache, keyed by version):
#   - Debian packages the e2e scripts call: lua5.4 (Argo CD health checks), curl, unzip;
#   - Python packages: pytest, openai (the real OpenAI client), pyyaml;
#   - the test API server and Prometheus (../shared/testenv/k8s-testenv install --with-prometheus);
#   - the local Kubernetes cluster's components and Helm (scripts/cluster.sh install: built from
#     the Go module proxy, about 12 minutes on 2 cores the first time);
#   - SeaweedFS, the S3 server of the model-sources tests (scripts/seaweedfs.sh install: built
#     from the Go module proxy, cached by version).
# scripts/test.sh runs this first; .ci/run runs scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== %s\n' "$*"; }
need_cmd() { command -v "$1" >/dev/null 2>&1; }

missing=()
need_cmd lua5.4 || missing+=(lua5.4)
need_cmd curl || missing+=(curl ca-certificates)
need_cmd unzip || missing+=(unzip)
if [ "${#missing[@]}" -gt 0 ]; then
    step "Debian packages: ${missing[*]}"
    if [ "$(id -u)" = 0 ] && need_cmd apt-get; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "missing: ${missing[*]} (install them, e.g. sudo apt-get install ${missing[*]})"
        exit 1
    fi
fi

if ! python3 -c 'import pytest, openai, yaml' 2>/dev/null; then
    step "Python packages (test clients)"
    python3 -m pip install -q --disable-pip-version-check pytest openai pyyaml
fi

step "test Kubernetes API server and Prometheus (cached after the first install)"
testenv=../shared/testenv/k8s-testenv
log=$(mktemp)
"$testenv" install --with-prometheus >"$log" 2>&1 || {
    tail -50 "$log"
    exit 1
}
tail -1 "$log"
rm -f "$log"

# scripts/test.sh builds these two in the background instead (TIDEGATE_DEPS_NO_GO_BUILDS=1),
# while the Rust build and the first tests run.
if [ -z "${TIDEGATE_DEPS_NO_GO_BUILDS:-}" ]; then
    step "the local cluster's components and Helm (cached after the first build)"
    scripts/cluster.sh install

    step "SeaweedFS, the S3 server of the model-sources tests (cached after the first build)"
    scripts/seaweedfs.sh install
fi
