#!/usr/bin/env bash
# GPU benchmark of tidegate-engine's CUDA build, in two modes:
#
#   scripts/gpu-bench.sh --build     on a build machine (Rust toolchain, no GPU needed):
#                                    installs the CUDA 13.0 toolkit (scripts/cuda-toolkit.sh),
#                                    builds `tidegate-engine --features cuda` in release,
#                                    strips it into dist/gpu-bench/ and prints its size
#   scripts/gpu-bench.sh             on the GPU machine (no Rust toolchain, no network):
#                                    runs that binary; carry the repository's scripts/ and
#                                    dist/gpu-bench/ there (about 56 MiB stripped)
#
# The run mode, made for one H200 and under 8 minutes:
#   1. prints the GPU, driver and CUDA versions (nvidia-smi) and refuses a driver < 580;
#   2. finds the CUDA 13 libraries (cuBLAS, cuBLASLt, cuRAND, NVRTC, cudart) itself: in the
#      Python environment's site-packages/nvidia/*/lib, then $CUDA_HOME/lib64, then the
#      system; sets LD_LIBRARY_PATH; libcuda.so.1 is the driver's;
#   3. measures the device's copy bandwidth (cudaMemcpy device-to-device over 1 GiB, through
#      cudart from Python's ctypes: no extra package);
#   4. runs the engine loop benchmark on random bf16 weights of Llama-3.2-1B shapes (16 layers)
#      and Llama-3.1-8B shapes with fewer layers (--layers-8b, default 8) at concurrency
#      1, 8, 32, 64, 128;
#   5. prints decode tok/s per level, the ratio to c=1, and c=1 as a fraction of the HBM
#      roofline: measured bandwidth / weight bytes read per decode token (bf16 weights; the
#      KV cache's few MB per step at these lengths are left out).
#
# The engine command it runs (bench_args below, the one definition; every option in it is
# checked against `tidegate-engine bench --help` before anything runs):
#   bench --device cuda --runner candle        the candle device runner on the GPU
#         --random-config FILE                 random bf16 weights of the shapes in FILE (a
#                                              Hugging Face config.json), made on the device
#                                              (no weight files, random prompt token ids)
#         --concurrency --prompt-tokens --output-tokens --rounds --history --kv-blocks
#         --max-batch-tokens --json            the levels; one JSON object on stdout, of which
#                                              it reads levels[].concurrency,
#                                              steady_decode_tokens_per_s, ttft_p50_s, itl_p50_s
# The engine's own bandwidth and roofline figures are the host's and are null on cuda; the
# roofline here comes from the measured device bandwidth.
#
# Usage: scripts/gpu-bench.sh --build [--out DIR]
#        scripts/gpu-bench.sh [--bin PATH] [--layers-8b N] [--only 1b|8b] [--quick]
#   --out DIR        where --build puts the binary and BUILD-INFO (default dist/gpu-bench)
#   --bin PATH       the CUDA engine binary to run (default dist/gpu-bench/tidegate-engine)
#   --layers-8b N    layers of the 8B-shaped model (default 8 of its 32)
#   --only 1b|8b     run one of the two models
#   --quick          concurrency 1, 8, 64 with 32 output tokens and one round (a smoke run)
# Each model's run is cut off at 200 s, so the whole run stays under 8 minutes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="$root/dist/gpu-bench"
bin=""
layers_8b=8
only=""
quick=0
mode=run
max_bytes=$((64 << 20))
min_driver=580

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "gpu-bench: error: $*" >&2; exit 1; }
say() { printf '\n==== %s\n' "$*"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) mode=build ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out_dir="$2"; shift ;;
    --bin) [[ $# -ge 2 ]] || die "--bin needs a path"; bin="$2"; shift ;;
    --layers-8b) [[ $# -ge 2 ]] || die "--layers-8b needs a number"; layers_8b="$2"; shift ;;
    --only) [[ $# -ge 2 ]] || die "--only needs 1b or 8b"; only="$2"; shift ;;
    --quick) quick=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done
[[ "$layers_8b" =~ ^[1-9][0-9]*$ && "$layers_8b" -le 32 ]] || die "--layers-8b must be 1..32"
[[ -z "$only" || "$only" == 1b || "$only" == 8b ]] || die "--only must be 1b or 8b"

# ---------------------------------------------------------------------------------------------
# --build: the stripped CUDA binary, made here.
# ---------------------------------------------------------------------------------------------
if [[ "$mode" == build ]]; then
  command -v cargo >/dev/null || die "--build needs cargo (a Rust toolchain)"
  command -v strip >/dev/null || die "--build needs strip (binutils)"
  say "CUDA 13.0 toolkit"
  env_lines=$("$root/scripts/cuda-toolkit.sh" --print-env --compute-cap 90) \
    || die "the CUDA toolkit could not be installed (scripts/cuda-toolkit.sh, output above)"
  eval "$env_lines"
  say "cargo build --release --locked -p tidegate-engine --features cuda (CUDA_COMPUTE_CAP=90)"
  t0=$SECONDS
  (cd "$root" && cargo build --release --locked -p tidegate-engine --features cuda)
  target="${CARGO_TARGET_DIR:-$root/target}"
  built="$target/release/tidegate-engine"
  [[ -x "$built" ]] || die "no binary at $built after the build"
  mkdir -p "$out_dir"
  strip -o "$out_dir/tidegate-engine.new" "$built"
  mv "$out_dir/tidegate-engine.new" "$out_dir/tidegate-engine"
  size=$(stat -c %s "$out_dir/tidegate-engine")
  {
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "toolkit: $(nvcc --version | grep release)"
    echo "CUDA_COMPUTE_CAP=90; needs driver >= $min_driver (CUDA 13.0)"
    echo "size: $size bytes"
    echo "needs:"
    readelf -d "$out_dir/tidegate-engine" | awk '/NEEDED/{print "  " $NF}' | tr -d '[]'
  } >"$out_dir/BUILD-INFO"
  cat "$out_dir/BUILD-INFO"
  echo "built in $((SECONDS - t0))s: $out_dir/tidegate-engine ($((size >> 20)) MiB stripped)"
  [[ "$size" -le "$max_bytes" ]] || die "the stripped binary is $((size >> 20)) MiB, over the 64 MiB to carry"
  echo "note: $built is now the CUDA build; 'cargo build --release -p tidegate-engine' puts the CPU one back"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# Run mode, on the GPU machine.
# ---------------------------------------------------------------------------------------------
[[ -n "$bin" ]] || bin="$out_dir/tidegate-engine"
[[ -x "$bin" ]] || die "no engine binary at $bin: build it with 'scripts/gpu-bench.sh --build' and carry dist/gpu-bench/"
command -v python3 >/dev/null || die "python3 is needed (library discovery, bandwidth probe, JSON)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver on this machine?"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$SECONDS

say "GPU and driver"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,clocks.max.memory \
  --format=csv || die "nvidia-smi cannot query the GPU"
nvidia-smi | sed -n '1,4p'
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | tr -d ' ')
[[ "${driver%%.*}" =~ ^[0-9]+$ ]] || die "cannot read the driver version ('$driver')"
[[ "${driver%%.*}" -ge "$min_driver" ]] \
  || die "driver $driver is older than $min_driver: this build (CUDA 13.0) needs driver >= $min_driver"
[[ -f "$out_dir/BUILD-INFO" ]] && sed -n '1,3p' "$out_dir/BUILD-INFO"

say "CUDA libraries"
# site-packages/nvidia/<pkg>/lib of every Python path, then the usual toolkit places.
mapfile -t libdirs < <(python3 - <<'PY'
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except AttributeError:
    pass
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
            seen.append(os.path.realpath(d))
for d in dict.fromkeys(seen):
    print(d)
PY
)
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
  [[ -d "$d" ]] && libdirs+=("$d")
done
if [[ ${#libdirs[@]} -gt 0 ]]; then
  LD_LIBRARY_PATH="$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
deps=$(ldd "$bin" 2>&1) || die "ldd cannot read $bin: $deps"
missing=$(awk '/not found/{print $1}' <<<"$deps")
grep -q libcuda <<<"$missing" && echo "libcuda.so.1 is the NVIDIA driver's: is the driver installed?" >&2
[[ -z "$missing" ]] \
  || die "libraries not found for $bin: $(tr '\n' ' ' <<<"$missing")(looked in: ${libdirs[*]:-none})"
grep -q 'libcuda\.so\.1' <<<"$deps" \
  || die "$bin is not a CUDA build (it does not link libcuda.so.1): build it with --build"
grep -E 'libcuda|cublas|curand|nvrtc|cudart' <<<"$deps" | sed 's/ (0x.*//'
cudart=$(awk '/libcudart/{print $3}' <<<"$deps")
[[ -f "$cudart" ]] || die "no libcudart.so for the bandwidth probe (ldd of $bin lists none)"

say "device copy bandwidth (cudaMemcpy device to device, 1 GiB, best of 20)"
python3 - "$cudart" >"$work/bw" <<'PY' || die "the bandwidth probe failed (message above)"
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1])
def ok(code, what):
    if code != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        sys.exit(f"{what}: {rt.cudaGetErrorString(code).decode()}")
n = 1 << 30
src, dst = ctypes.c_void_p(), ctypes.c_void_p()
ok(rt.cudaMalloc(ctypes.byref(src), ctypes.c_size_t(n)), "cudaMalloc")
ok(rt.cudaMalloc(ctypes.byref(dst), ctypes.c_size_t(n)), "cudaMalloc")
ok(rt.cudaMemset(src, 1, ctypes.c_size_t(n)), "cudaMemset")
start, stop = ctypes.c_void_p(), ctypes.c_void_p()
ok(rt.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
ok(rt.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
best = 0.0
for _ in range(20):
    ok(rt.cudaEventRecord(start, None), "cudaEventRecord")
    ok(rt.cudaMemcpy(dst, src, ctypes.c_size_t(n), 3), "cudaMemcpy")  # 3: device to device
    ok(rt.cudaEventRecord(stop, None), "cudaEventRecord")
    ok(rt.cudaEventSynchronize(stop), "cudaEventSynchronize")
    ms = ctypes.c_float()
    ok(rt.cudaEventElapsedTime(ctypes.byref(ms), start, stop), "cudaEventElapsedTime")
    best = max(best, n / (ms.value / 1e3))
# Bytes copied per second, and HBM traffic (each byte is read once and written once).
print(f"{best / 1e9:.1f} {2 * best / 1e9:.1f}")
PY
read -r copy_gb traffic_gb <"$work/bw"
echo "copy ${copy_gb} GB/s (bytes copied), HBM traffic ${traffic_gb} GB/s (read + write): the roofline uses the traffic figure"

if [[ "$quick" == 1 ]]; then
  levels=1,8,64 out_tokens=32 rounds=1
else
  levels=1,8,32,64,128 out_tokens=128 rounds=2
fi

# The engine's command line for one config file, one argument a line.
bench_args() { # config-file
  printf '%s\n' bench --device cuda --runner candle --random-config "$1" \
    --concurrency "$levels" --prompt-tokens 32 --output-tokens "$out_tokens" --rounds "$rounds" \
    --history 0 --kv-blocks 4096 --max-batch-tokens 2048 --json
}

say "engine flags"
help=$("$bin" bench --help) || die "$bin bench --help failed (is libcuda.so.1 from the driver loadable?)"
mapfile -t wanted < <(bench_args FILE | grep -- '^--')
for flag in "${wanted[@]}"; do
  grep -qE -- "(^|[[:space:],])$flag([[:space:]=,]|$)" <<<"$help" \
    || die "this engine's bench has no $flag (an older binary? rebuild with --build)"
done
echo "bench has ${wanted[*]}"

# Hugging Face config.json shapes (weights are random; only the shapes matter).
write_config() { # name layers tied hidden inter heads kv
  cat >"$work/$1.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
 "hidden_size": $4, "intermediate_size": $5, "num_hidden_layers": $2,
 "num_attention_heads": $6, "num_key_value_heads": $7, "vocab_size": 128256,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
 "tie_word_embeddings": $3, "bos_token_id": 128000, "eos_token_id": 128001}
EOF
}
write_config llama-3.2-1b 16 true 2048 8192 32 8
write_config "llama-3.1-8b-${layers_8b}l" "$layers_8b" false 4096 14336 32 8

bench_one() { # config-name
  local name="$1" t0=$SECONDS
  say "bench $name: --device cuda --runner candle, concurrency $levels, $out_tokens output tokens"
  mapfile -t args < <(bench_args "$work/$name.json")
  if ! timeout 200 "$bin" "${args[@]}" >"$work/$name.out" 2>"$work/$name.err"; then
    tail -20 "$work/$name.err" >&2
    echo "gpu-bench: $name failed or ran past 200 s (output above)" >&2
    return 1
  fi
  echo "ran in $((SECONDS - t0))s"
  python3 - "$work/$name.json" "$work/$name.out" "$traffic_gb" "$name" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
lines = [l for l in open(sys.argv[2]).read().splitlines() if l.startswith("{")]
if not lines:
    sys.exit(f"{sys.argv[4]}: the bench printed no JSON")
rep = json.loads(lines[-1])
bw = float(sys.argv[3]) * 1e9
h, i, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
hd = h // cfg["num_attention_heads"]
kv = cfg["num_key_value_heads"] * hd
per_layer = h * h * 2 + h * kv * 2 + 3 * h * i  # q, o; k, v; gate, up, down
weights = L * per_layer + cfg["vocab_size"] * h  # + the LM head (one embedding row is noise)
bytes_tok = 2 * weights  # bf16
roof = bw / bytes_tok
levels = rep.get("levels", [])
base = next((l["steady_decode_tokens_per_s"] for l in levels if l["concurrency"] == 1), None)
print(f"{sys.argv[4]}: {weights / 1e9:.2f} B weights read per token, {bytes_tok / 1e9:.2f} GB bf16; "
      f"HBM roofline at c=1 = {roof:.0f} tok/s")
print("   conc   decode tok/s   vs c=1   ttft_p50   itl_p50")
for l in levels:
    d = l["steady_decode_tokens_per_s"]
    ratio = d / base if base else float("nan")
    print(f"   {l['concurrency']:>4}   {d:>12.1f}   {ratio:>5.2f}x   {l['ttft_p50_s']:>7.3f}s   "
          f"{l['itl_p50_s'] * 1e3:>6.2f}ms")
if base:
    print(f"   c=1: {100 * base / roof:.0f}% of the HBM roofline")
    c64 = next((l["steady_decode_tokens_per_s"] for l in levels if l["concurrency"] == 64), None)
    if "8b" in sys.argv[4]:
        print(f"   goals: c=1 >= 60% of roofline: {'met' if base / roof >= 0.6 else 'NOT met'}; "
              f"c=64 >= 15x c=1: " + ("n/a" if c64 is None else
              f"{c64 / base:.1f}x, {'met' if c64 / base >= 15 else 'NOT met'}"))
PY
}

failed=0
[[ "$only" == 8b ]] || bench_one llama-3.2-1b || failed=1
[[ "$only" == 1b ]] || bench_one "llama-3.1-8b-${layers_8b}l" || failed=1
say "done in $((SECONDS - started))s"
exit "$failed"
