#!/usr/bin/env bash
# bench-vs-llamacpp.sh -- tidegate-engine and llama.cpp's llama-server side by side on the
# same GGUF file, runs alternated, medians and ratios printed.
#
# The peer stays outside this repository: ../shared/peer/peer-llamacpp.sh (run once here to
# set up, idempotently, llama.cpp 0.7.0 in a private chroot with SmolLM2-135M in Q4_1, F32,
# F16 and Q8_0; needs root) and ../shared/peer/loadgen.py (the closed-loop OpenAI client
# used for both servers: 128-token ignore_eos completions, temperature 0, fixed seed).
#
# For each format and each of REPS repetitions, both servers are started in turn (the order
# flips every repetition so drift from other load on the machine hits both alike), measured
# at each concurrency level, and stopped. Printed: per format and level, the median
# aggregate completion tok/s of each server over the repetitions, their min..max, and
# tidegate / llama.cpp. Both servers use THREADS threads and up to 32 sequences per step.
#
# Each run also records how many cores other processes used meanwhile ("foreign"): the
# machine is shared, and a run with foreign load > 0.3 cores is marked in the raw log.
#
# MODEL picks the file: smollm2 (SmolLM2-135M-Instruct, ~80-140 MB: it sits in a server
# CPU's last-level cache, so it measures compute), or llama1b / llama3b (random weights with
# the shapes of Llama-3.2-1B / 3B, written once by scripts/gen-llama-gguf.py in F16 and
# quantized by the peer's llama-quantize to each of FORMATS, so both servers read the same
# file: decode there is bound by memory bandwidth, as for real models).
#
# Also printed, at one stream: the fraction of the memory-bandwidth roofline each server
# reaches, tok/s × weight bytes read per token ÷ the measured read bandwidth (tidegate's
# `bench-model --bandwidth-only`, the same threads). Bytes per token: tidegate's own figure
# from /v1/models; for llama.cpp the file's size (every tensor is read once per token; the
# tied embedding table is read whole as the output layer).
#
# Knobs (environment): MODEL=smollm2  FORMATS="Q4_1 Q8_0 F32" (also Q4_0, BF16, F16)  CONC=1,32  REPS=3  THREADS=2
#   NPREDICT=128  WEIGHTS=as-file (tidegate --weights)  BIN=target/release/tidegate-engine
#   KV_BLOCKS=4096 (tidegate --kv-blocks; 2048 for the Llama shapes)
#   PEER_CACHE=$HOME/.cache/peer-llamacpp (as the peer script)  OUT=<dir for raw results>
#   CPU_CLASS=avx2: both servers run what an AVX2-only CPU (Zen 3, Haswell to Comet Lake) runs,
#     on a CPU with more: tidegate with --cpu-kernels avx2 (every kernel family at AVX2 width),
#     llama.cpp with its ggml `haswell` CPU variant the only one it can load (the others are
#     hidden from it by a private mount), so an AVX-512 machine can check that configuration.
#     Unset: each server picks the best its CPU has.
# Build first: cargo build --release -p tidegate-engine
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peer="$(cd "${root}/../shared/peer" && pwd)"
FORMATS="${FORMATS:-Q4_1 Q8_0 F32}"
CONC="${CONC:-1,32}"
REPS="${REPS:-3}"
THREADS="${THREADS:-2}"
NPREDICT="${NPREDICT:-128}"
WEIGHTS="${WEIGHTS:-as-file}"
BIN="${BIN:-${CARGO_TARGET_DIR:-${root}/target}/release/tidegate-engine}"
CACHE="${PEER_CACHE:-$HOME/.cache/peer-llamacpp}"
CHROOT="${CACHE}/sid-root"
MODEL="${MODEL:-smollm2}"
case "${MODEL}" in
  smollm2) MODEL_BASE="SmolLM2-135M-Instruct"; KV_BLOCKS="${KV_BLOCKS:-4096}" ;;
  llama1b|llama3b) MODEL_BASE="random-llama-3.2-${MODEL#llama}"; KV_BLOCKS="${KV_BLOCKS:-2048}" ;;
  *) echo "MODEL=${MODEL}: expected smollm2, llama1b or llama3b" >&2; exit 2 ;;
esac
OUT="${OUT:-$(mktemp -d /tmp/bench-vs-llamacpp.XXXXXX)}"
CPU_CLASS="${CPU_CLASS:-}"
case "${CPU_CLASS}" in
  "") GGML_CPU="" ;;
  avx2) GGML_CPU=haswell; export TIDEGATE_CPU_KERNELS=avx2 ;;
  *) echo "CPU_CLASS=${CPU_CLASS}: expected avx2 (or unset)" >&2; exit 2 ;;
esac
GGML_DIR="${CHROOT}/usr/lib/x86_64-linux-gnu/ggml/backends0"
LLAMA_PORT=18080
TG_PORT=18090
mkdir -p "${OUT}"

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

[[ -x "${BIN}" ]] || { echo "no ${BIN}: cargo build --release -p tidegate-engine" >&2; exit 1; }
log "setting up the peer (idempotent)"
PEER_EXTRA_QUANTS=Q8_0 PEER_SKIP="bench server membw" "${peer}/peer-llamacpp.sh" >"${OUT}/peer-setup.log" 2>&1 \
  || { tail -20 "${OUT}/peer-setup.log" >&2; exit 1; }

# Each of FORMATS the models folder lacks, by llama-quantize from the file in format $1.
# Idempotent: existing files are kept.
quantize_missing() {
  local models="${CHROOT}/models" src="$1" fmt
  for fmt in ${FORMATS}; do
    [[ "${fmt}" == "${src}" || -s "${models}/${MODEL_BASE}.${fmt}.gguf" ]] && continue
    log "llama-quantize ${MODEL_BASE} ${src} -> ${fmt}"
    chroot "${CHROOT}" llama-quantize "/models/${MODEL_BASE}.${src}.gguf" "/models/${MODEL_BASE}.${fmt}.gguf.tmp" "${fmt}" \
      >"${OUT}/quantize-${fmt}.log" 2>&1 || { tail -5 "${OUT}/quantize-${fmt}.log" >&2; exit 1; }
    mv "${models}/${MODEL_BASE}.${fmt}.gguf.tmp" "${models}/${MODEL_BASE}.${fmt}.gguf"
  done
}

# The Llama-shaped files: F16 from the generator (in a venv with the gguf package, cached),
# then each format by llama-quantize.
prep_llama_shapes() {
  local models="${CHROOT}/models" venv="${CACHE}/gguf-venv"
  if [[ ! -s "${models}/${MODEL_BASE}.F16.gguf" ]]; then
    [[ -x "${venv}/bin/python" ]] || { python3 -m venv "${venv}" && "${venv}/bin/pip" -q install numpy gguf; }
    log "writing ${MODEL_BASE}.F16.gguf (random weights)"
    "${venv}/bin/python" "${root}/scripts/gen-llama-gguf.py" --shape "${MODEL#llama}" \
      --tokenizer-from "${models}/SmolLM2-135M-Instruct.Q4_1.gguf" --out "${models}/${MODEL_BASE}.F16.gguf.tmp"
    mv "${models}/${MODEL_BASE}.F16.gguf.tmp" "${models}/${MODEL_BASE}.F16.gguf"
  fi
  quantize_missing F16
}
# SmolLM2's formats the peer does not set up (BF16, Q4_0) come from its F32 file.
if [[ "${MODEL}" == smollm2 ]]; then quantize_missing F32; else prep_llama_shapes; fi

# Read bandwidth (best of 8 passes over 256 MiB), measured before each format; the roofline
# uses the median of these, since on a shared host it moves with its neighbours' load.
measure_bandwidth() {
  RAYON_NUM_THREADS="${THREADS}" "${BIN}" bench-model --bandwidth-only >>"${OUT}/bandwidth.txt"
  log "read bandwidth $(awk '/^memory bandwidth/{v=$4} END{print v}' "${OUT}/bandwidth.txt") GB/s"
}
: >"${OUT}/bandwidth.txt"

SERVER_PID=""
URL=""
stop_server() {
  if [[ -n "${SERVER_PID}" ]] && kill -0 "${SERVER_PID}" 2>/dev/null; then
    kill "${SERVER_PID}" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "${SERVER_PID}" 2>/dev/null || break; sleep 0.2; done
    kill -9 "${SERVER_PID}" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT INT TERM

wait_healthy() {  # $1 = url, $2 = log
  for _ in $(seq 1 240); do
    curl -fs "$1" >/dev/null 2>&1 && return 0
    kill -0 "${SERVER_PID}" 2>/dev/null || { tail -20 "$2" >&2; exit 1; }
    sleep 0.5
  done
  echo "server did not become ready: $1" >&2; exit 1
}

# With CPU_CLASS, llama.cpp sees a backends folder holding only the ggml CPU variant that
# class picks (ggml loads the best-scoring variant it finds; the chroot itself is untouched).
ggml_only_dir() {
  local d="${OUT}/ggml-${GGML_CPU}"
  [[ -f "${GGML_DIR}/libggml-cpu-${GGML_CPU}.so" ]] \
    || { echo "no ggml CPU variant ${GGML_CPU} in ${GGML_DIR}" >&2; exit 1; }
  mkdir -p "${d}" && cp -f "${GGML_DIR}/libggml-cpu-${GGML_CPU}.so" "${d}/"
  printf '%s' "${d}"
}

start_llama() {  # $1 = format
  local run=(chroot "${CHROOT}" llama-server -m "/models/${MODEL_BASE}.$1.gguf" --host 127.0.0.1
    --port "${LLAMA_PORT}" -np 32 -c 16384 --threads "${THREADS}" --threads-batch "${THREADS}"
    --cont-batching --seed 1234 -a "${MODEL}-$1" --no-webui)
  if [[ -n "${GGML_CPU}" ]]; then
    # exec keeps the server's pid the one stop_server kills.
    unshare -m sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' \
      "$(ggml_only_dir)" "${GGML_DIR}" "${run[@]}" >"${OUT}/llama-$1.log" 2>&1 &
  else
    "${run[@]}" >"${OUT}/llama-$1.log" 2>&1 &
  fi
  SERVER_PID=$!
  URL="http://127.0.0.1:${LLAMA_PORT}"
  wait_healthy "${URL}/health" "${OUT}/llama-$1.log"
  # Which ggml CPU variant the server mapped (it does not log it), kept beside its log.
  grep -o 'libggml-cpu-[a-z0-9_]*\.so' "/proc/${SERVER_PID}/maps" | sort -u >"${OUT}/llama-$1.ggml-cpu" || true
  if [[ -n "${GGML_CPU}" ]] && [[ "$(cat "${OUT}/llama-$1.ggml-cpu")" != "libggml-cpu-${GGML_CPU}.so" ]]; then
    echo "llama.cpp loaded $(cat "${OUT}/llama-$1.ggml-cpu"), not the ggml ${GGML_CPU} variant alone" >&2; exit 1
  fi
}

start_tidegate() {  # $1 = format
  "${BIN}" serve --model "${CHROOT}/models/${MODEL_BASE}.$1.gguf" --served-model-name "${MODEL}-$1" \
    --listen "127.0.0.1:${TG_PORT}" --admin-disabled --threads "${THREADS}" --weights "${WEIGHTS}" \
    --max-batch-size 32 --max-queued-requests 256 --kv-blocks "${KV_BLOCKS}" >"${OUT}/tidegate-$1.log" 2>&1 &
  SERVER_PID=$!
  URL="http://127.0.0.1:${TG_PORT}"
  wait_healthy "${URL}/readyz" "${OUT}/tidegate-$1.log"
  curl -fs "${URL}/v1/models" >"${OUT}/tidegate-$1.models.json"
}

HZ="$(getconf CLK_TCK)"
# busy jiffies of the whole machine, and of one process (with its reaped children)
sys_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
pid_cpu() { awk '{print $14+$15+$16+$17}' "/proc/$1/stat" 2>/dev/null || echo 0; }

measure() {  # $1 = server (llama|tidegate), $2 = format, $3 = rep
  "start_$1" "$2"   # sets SERVER_PID and URL (no subshell, so stop_server sees the pid)
  local b0 s0 t0 b1 s1 t1 u foreign
  b0=$(sys_busy); s0=$(pid_cpu "${SERVER_PID}"); t0=$(date +%s.%N)
  /usr/bin/time -f '%U %S' -o "${OUT}/$1-$2-rep$3.time" \
    python3 "${peer}/loadgen.py" "${URL}" "${MODEL}-$2" --concurrency "${CONC}" --max-tokens "${NPREDICT}" \
    --rounds 1 --min-requests 4 --label "$1 $2" --json-out "${OUT}/$1-$2-rep$3.json" \
    >"${OUT}/$1-$2-rep$3.txt" 2>&1 || true
  b1=$(sys_busy); s1=$(pid_cpu "${SERVER_PID}"); t1=$(date +%s.%N)
  u=$(awk '{print $1+$2}' "${OUT}/$1-$2-rep$3.time")
  foreign=$(awk -v d=$((b1 - b0 - (s1 - s0))) -v hz="${HZ}" -v u="${u}" -v t0="${t0}" -v t1="${t1}" \
    'BEGIN{x=(d/hz-u)/(t1-t0); if (x<0) x=0; printf "%.2f", x}')
  echo "${foreign}" >"${OUT}/$1-$2-rep$3.foreign"
  stop_server
  log "$1 $2 rep $3: $(awk '/^ +[0-9]+ /{printf "c=%s %s tok/s  ", $1, $6}' "${OUT}/$1-$2-rep$3.txt")foreign ${foreign} cores"
}

for fmt in ${FORMATS}; do
  measure_bandwidth
  for rep in $(seq 1 "${REPS}"); do
    if (( rep % 2 )); then order="llama tidegate"; else order="tidegate llama"; fi
    for s in ${order}; do measure "${s}" "${fmt}" "${rep}"; done
  done
done

echo
READ_GBS="$(awk '/^memory bandwidth/{print $4}' "${OUT}/bandwidth.txt" | sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')"
echo "== ${MODEL_BASE}: tidegate-engine (--weights ${WEIGHTS}) vs llama.cpp llama-server, ${THREADS} threads, ${NPREDICT}-token requests, ${REPS} alternated reps${CPU_CLASS:+, CPU_CLASS=${CPU_CLASS} (llama.cpp: ggml ${GGML_CPU})} =="
echo "   CPU: $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo); $(grep -m1 '^kernel sets' "${OUT}/bandwidth.txt"); read bandwidth ${READ_GBS} GB/s (median of $(grep -c '^memory bandwidth' "${OUT}/bandwidth.txt")); llama.cpp ran $(cat "${OUT}"/llama-*.ggml-cpu 2>/dev/null | sort -u | tr '\n' ' ')"
python3 - "${OUT}" "${FORMATS}" "${REPS}" "${READ_GBS}" "${CHROOT}/models/${MODEL_BASE}" <<'PY'
import json, os, statistics, sys
out, formats, reps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
read_bps, base = float(sys.argv[4]) * 1e9, sys.argv[5]
def bytes_per_token(server, fmt):
    if server == "llama":
        return os.path.getsize(f"{base}.{fmt}.gguf")
    p = os.path.join(out, f"tidegate-{fmt}.models.json")
    return json.load(open(p))["data"][0]["weight_bytes_per_token"] if os.path.exists(p) else 0
foreign = []
def rates(server, fmt):
    by = {}
    for r in range(1, reps + 1):
        f = os.path.join(out, f"{server}-{fmt}-rep{r}.foreign")
        if os.path.exists(f):
            foreign.append(float(open(f).read()))
        p = os.path.join(out, f"{server}-{fmt}-rep{r}.json")
        if not os.path.exists(p):
            continue
        for L in json.load(open(p))["levels"]:
            if L.get("ok"):
                by.setdefault(L["concurrency"], []).append(L["agg_tok_s"])
    return by
print(f"{'format':<6} {'conc':>4} {'llama.cpp tok/s':>22} {'tidegate tok/s':>22} {'ratio':>6} {'roofline llama/tidegate':>24}")
for fmt in formats:
    a, b = rates("llama", fmt), rates("tidegate", fmt)
    for c in sorted(set(a) | set(b)):
        la, lb = a.get(c, []), b.get(c, [])
        ma = statistics.median(la) if la else float("nan")
        mb = statistics.median(lb) if lb else float("nan")
        rng = lambda l: f"({min(l):.0f}..{max(l):.0f})" if l else ""
        roof = ""
        if c == 1:
            ra, rb = (m * bytes_per_token(s, fmt) / read_bps for m, s in ((ma, "llama"), (mb, "tidegate")))
            roof = f"{ra:.2f} / {rb:.2f}"
        print(f"{fmt:<6} {c:>4} {ma:>9.1f} {rng(la):>12} {mb:>9.1f} {rng(lb):>12} {mb / ma:>6.2f} {roof:>24}")
if foreign:
    print(f"foreign load (cores used by other processes) per run: median {statistics.median(foreign):.2f}, max {max(foreign):.2f}")
PY
echo "(median aggregate completion tok/s; (min..max) over the reps; raw results in ${OUT})"
