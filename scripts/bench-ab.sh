#!/usr/bin/env bash
# bench-ab.sh -- two builds of tidegate-engine on the same model file, runs alternated,
# medians and the ratio printed: the "no regression" check of a change (before vs after),
# beside bench-vs-llamacpp.sh, which compares against the peer.
#
# Usage: scripts/bench-ab.sh BIN_A BIN_B [MODEL_FILE]
#   BIN_A, BIN_B  two tidegate-engine binaries (release builds), A the baseline
#   MODEL_FILE    a GGUF or model directory (default models/smollm2/…Q4_1.gguf; run
#                 scripts/fetch-model.sh first)
# For each of WEIGHTS (tidegate --weights, e.g. "as-file q8_0") and each of REPS repetitions,
# both servers are started in turn (the order flips every repetition, so drift from other
# load on the machine hits both alike), measured by ../shared/peer/loadgen.py at each level
# of CONC (128-token ignore_eos completions, temperature 0), and stopped. Printed per
# weights and level: the median aggregate completion tok/s of each build, min..max over the
# repetitions, and B / A.
#
# Knobs (environment): WEIGHTS="as-file"  CONC=1,32  REPS=3  THREADS=2  NPREDICT=128
#   KV_BLOCKS=4096  OUT=<dir for raw results>
set -euo pipefail

if [[ $# -lt 2 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 2 ]] && exit 0 || exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peer="$(cd "${root}/../shared/peer" && pwd)"
BIN_A="$1"
BIN_B="$2"
MODEL_FILE="${3:-${root}/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
WEIGHTS="${WEIGHTS:-as-file}"
CONC="${CONC:-1,32}"
REPS="${REPS:-3}"
THREADS="${THREADS:-2}"
NPREDICT="${NPREDICT:-128}"
KV_BLOCKS="${KV_BLOCKS:-4096}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/bench-ab.XXXXXX")}"
PORT=18095
mkdir -p "${OUT}"
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

for b in "${BIN_A}" "${BIN_B}"; do
  [[ -x "${b}" ]] || { echo "not an executable: ${b}" >&2; exit 2; }
done
[[ -e "${MODEL_FILE}" ]] || { echo "no model at ${MODEL_FILE} (scripts/fetch-model.sh fetches SmolLM2)" >&2; exit 2; }

SERVER_PID=""
stop_server() {
  if [[ -n "${SERVER_PID}" ]] && kill -0 "${SERVER_PID}" 2>/dev/null; then
    kill "${SERVER_PID}" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "${SERVER_PID}" 2>/dev/null || break; sleep 0.2; done
    kill -9 "${SERVER_PID}" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT INT TERM

start() {  # $1 = binary, $2 = weights, $3 = log
  "$1" serve --model "${MODEL_FILE}" --served-model-name ab --listen "127.0.0.1:${PORT}" \
    --admin-disabled --threads "${THREADS}" --weights "$2" --max-batch-size 32 \
    --max-queued-requests 256 --kv-blocks "${KV_BLOCKS}" >"$3" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do
    curl -fs "http://127.0.0.1:${PORT}/readyz" >/dev/null 2>&1 && return 0
    kill -0 "${SERVER_PID}" 2>/dev/null || { tail -20 "$3" >&2; exit 1; }
    sleep 0.5
  done
  echo "server did not become ready: $1" >&2
  exit 1
}

measure() {  # $1 = A|B, $2 = weights, $3 = rep
  local bin="${BIN_A}"
  [[ "$1" == B ]] && bin="${BIN_B}"
  start "${bin}" "$2" "${OUT}/$1-$2-rep$3.log"
  python3 "${peer}/loadgen.py" "http://127.0.0.1:${PORT}" ab --concurrency "${CONC}" \
    --max-tokens "${NPREDICT}" --rounds 1 --min-requests 4 --label "$1 $2" \
    --json-out "${OUT}/$1-$2-rep$3.json" >"${OUT}/$1-$2-rep$3.txt" 2>&1 || true
  stop_server
  log "$1 $2 rep $3: $(awk '/^ +[0-9]+ /{printf "c=%s %s tok/s  ", $1, $6}' "${OUT}/$1-$2-rep$3.txt")"
}

for w in ${WEIGHTS}; do
  for rep in $(seq 1 "${REPS}"); do
    if (( rep % 2 )); then order="A B"; else order="B A"; fi
    for s in ${order}; do measure "${s}" "${w}" "${rep}"; done
  done
done

echo
echo "== $(basename "${MODEL_FILE}"): A=${BIN_A} vs B=${BIN_B}, ${THREADS} threads, ${NPREDICT}-token requests, ${REPS} alternated reps =="
echo "   CPU: $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo); $(grep -m1 -o 'kernel set[^"]*' "${OUT}"/A-*-rep1.log 2>/dev/null | head -1)"
python3 - "${OUT}" "${WEIGHTS}" "${REPS}" <<'PY'
import json, os, statistics, sys
out, weights, reps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def rates(side, w):
    by = {}
    for r in range(1, reps + 1):
        p = os.path.join(out, f"{side}-{w}-rep{r}.json")
        if os.path.exists(p):
            for level in json.load(open(p))["levels"]:
                if level.get("ok"):
                    by.setdefault(level["concurrency"], []).append(level["agg_tok_s"])
    return by
print(f"{'weights':<8} {'conc':>4} {'A tok/s':>22} {'B tok/s':>22} {'B/A':>6}")
for w in weights:
    a, b = rates("A", w), rates("B", w)
    for c in sorted(set(a) | set(b)):
        la, lb = a.get(c, []), b.get(c, [])
        ma = statistics.median(la) if la else float("nan")
        mb = statistics.median(lb) if lb else float("nan")
        rng = lambda l: f"({min(l):.0f}..{max(l):.0f})" if l else ""
        print(f"{w:<8} {c:>4} {ma:>9.1f} {rng(la):>12} {mb:>9.1f} {rng(lb):>12} {mb / ma:>6.2f}")
PY
echo "(median aggregate completion tok/s; (min..max) over the reps; raw results in ${OUT})"
