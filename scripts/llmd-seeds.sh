#!/usr/bin/env bash
# The llm-d ramp scenario (2 -> 10 -> 1 requests/s, pods ready 100 s after they are ordered)
# on several draws of its traffic: the checked-in examples/traces/llmd-ramp.csv is seed 7, one
# draw of the Poisson arrivals; this replays others of the same shape, so a setting is judged
# on more than one draw. Prints one row per seed and the median and worst.
#
#   scripts/llmd-seeds.sh [-f POOL.yaml] [SEED ...]      (default: examples/traces/llmd-pool.yaml, seeds 7 1 2 3 4 5)
#
# Needs python3 and the operator binary (TIDEGATE_OPERATOR, else target/release, else it is built).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
pool=$root/examples/traces/llmd-pool.yaml
seeds=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -f) [ $# -ge 2 ] || { echo "llmd-seeds: -f needs a file" >&2; exit 2; }; pool=$2; shift 2 ;;
    *) [[ "$1" =~ ^[0-9]+$ ]] || { echo "llmd-seeds: '$1' is not a seed (a non-negative integer)" >&2; exit 2; }
       seeds+=("$1"); shift ;;
  esac
done
[ ${#seeds[@]} -gt 0 ] || seeds=(7 1 2 3 4 5)
[ -f "$pool" ] || { echo "llmd-seeds: no pool file $pool" >&2; exit 2; }
# -f and TIDEGATE_OPERATOR are read from the caller's directory; the rest from the repository.
pool=$(cd "$(dirname "$pool")" && pwd)/$(basename "$pool")
if [ -n "${TIDEGATE_OPERATOR:-}" ] && [ -x "$TIDEGATE_OPERATOR" ]; then
  TIDEGATE_OPERATOR=$(cd "$(dirname "$TIDEGATE_OPERATOR")" && pwd)/$(basename "$TIDEGATE_OPERATOR")
fi
cd "$root"

bin=${TIDEGATE_OPERATOR:-target/release/tidegate-operator}
if [ ! -x "$bin" ]; then
  cargo build --release -q -p tidegate-operator
  bin=target/release/tidegate-operator
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for s in "${seeds[@]}"; do
  python3 examples/traces/gen-llmd-ramp.py --seed "$s" > "$dir/ramp-$s.csv"
  "$bin" simulate -f "$pool" --trace-file "$dir/ramp-$s.csv" --startup-seconds 100 \
    --static-replicas 8 --threads 1 --json > "$dir/out-$s.json"
done

python3 - "$dir" "${seeds[@]}" <<'PY'
import json, statistics, sys
d, seeds = sys.argv[1], sys.argv[2:]
pols = ("tidegate", "hpa-kv-util", "oracle")
rows = []
print("seed | " + " | ".join(f"{p}: attainment, × static 8, reversals" for p in pols))
for s in seeds:
    out = json.load(open(f"{d}/out-{s}.json"))
    by = {r["policy"]: r for r in out["results"]}
    static = out["static_replicas"] * out["duration_hours"]
    row = [(by[p]["attainment_existing"] * 100, by[p]["gpu_hours"] / static, by[p]["reversals"]) for p in pols]
    rows.append(row)
    print(f"{s:>4} | " + " | ".join(f"{a:6.2f}% {x:.3f}× {v:3d}" for a, x, v in row))
for name, f in (("median", statistics.median), ("worst", None)):
    cells = []
    for i in range(len(pols)):
        a = [r[i][0] for r in rows]; x = [r[i][1] for r in rows]; v = [r[i][2] for r in rows]
        if f:
            cells.append(f"{f(a):6.2f}% {f(x):.3f}× {f(v):5.1f}")
        else:
            cells.append(f"{min(a):6.2f}% {max(x):.3f}× {max(v):3d}")
    print(f"{name:>6} | " + " | ".join(cells))
PY
