#!/usr/bin/env bash
# Overload benchmark on a real model: starts `tidegate-engine serve` on SmolLM2-135M (fetched
# by scripts/fetch-model.sh if missing), waits until it is ready, then runs
# `tidegate-engine overload-bench` against it: capacity measured with closed-loop clients,
# then 4x that capacity offered open-loop for 60 s. Exits with the bench's verdict.
#
#   scripts/overload-bench.sh                      # defaults below
#   scripts/overload-bench.sh --duration 30s       # extra flags go to overload-bench
#
# Environment: PORT (8390), THREADS (engine compute threads, default: all cores),
# QUEUE_WAIT_TARGET (2s, the default tier's target the engine enforces and the bench checks).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
port="${PORT:-8390}"
target="${QUEUE_WAIT_TARGET:-2s}"

scripts/fetch-model.sh
cargo build --release --quiet -p tidegate-engine
bin="${CARGO_TARGET_DIR:-target}/release/tidegate-engine"

log="$(mktemp)"
threads=()
[[ -n "${THREADS:-}" ]] && threads=(--threads "${THREADS}")
"${bin}" serve --model models/smollm2 --listen "127.0.0.1:${port}" --admin-disabled \
  "${threads[@]}" >"${log}" 2>&1 &
engine=$!
trap 'kill "${engine}" 2>/dev/null || true; wait "${engine}" 2>/dev/null || true; rm -f "${log}"' EXIT

for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:${port}/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "${engine}" 2>/dev/null; then cat "${log}"; echo "engine exited" >&2; exit 1; fi
  sleep 0.5
done
curl -fsS "http://127.0.0.1:${port}/readyz" >/dev/null || { cat "${log}"; exit 1; }

"${bin}" overload-bench --target "http://127.0.0.1:${port}" --rate-multiple 4 --duration 60s \
  --queue-wait-target "${target}" "$@"
