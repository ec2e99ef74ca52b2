#!/usr/bin/env bash
# The official `openai` Python client (PyPI) against a real `tidegate-engine serve` process:
# streaming chat, plain completion, error shapes, and the paused-admission refusal. Serves
# SmolLM2 when it has been fetched (models/smollm2), the random model otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
export TIDEGATE_ENGINE_BIN=${TIDEGATE_ENGINE_BIN:-$target/debug/tidegate-engine}
[ -x "$TIDEGATE_ENGINE_BIN" ] || cargo build --quiet -p tidegate-engine
python3 -c 'import openai, pytest' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check openai pytest
if [ -z "${TIDEGATE_TEST_MODEL:-}" ]; then
    gguf=$(find models/smollm2 -name '*.gguf' 2>/dev/null | head -1 || true)
    if [ -n "$gguf" ]; then
        export TIDEGATE_TEST_MODEL=$gguf
    fi
fi
echo "== openai client against tidegate-engine (model: ${TIDEGATE_TEST_MODEL:-fake backend})"
python3 -m pytest -q e2e/test_openai_client.py
