#!/usr/bin/env bash
# The README's first command: builds tidegate and runs it locally — engine processes on this
# machine, the real control loop, and a tidal load that makes the pool scale up, pause new
# tenants at its ceiling, reopen and scale down. Extra arguments go to `tidegate-operator local`.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "building tidegate (release)…" >&2
cargo build --release --quiet -p tidegate-operator -p tidegate-engine
target=${CARGO_TARGET_DIR:-target}
exec "$target/release/tidegate-operator" local -f examples/local/ --engine-bin "$target/release/tidegate-engine" "$@"
