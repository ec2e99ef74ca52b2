#!/usr/bin/env bash
# Installs a CUDA 13.0 toolkit from NVIDIA's Python wheels into a cache and assembles a
# toolkit folder that candle's CUDA build (cudarc, candle-kernels' nvcc) can use:
#
#   <cache>/site/      the wheels, installed with `pip install --target`
#   <cache>/toolkit/   bin, include, nvvm (links into the wheels), lib64 (unversioned .so
#                      links, and a link-time-only libcuda.so stub)
#   <cache>/env.sh     the environment to build with: `. <cache>/env.sh`
#
# No GPU and no driver are needed. libcuda belongs to the GPU driver and is in no wheel, so
# lib64/libcuda.so is a stub (SONAME libcuda.so.1, empty functions named as in cuda.h)
# generated here with the C compiler: the linker records the dependency, and the driver's
# real libcuda.so.1 is loaded at run time. The stub is never copied into a binary, an image or the repository.
#
# Idempotent: a second run with the same pins only rewrites env.sh (seconds).
#
# Usage: scripts/cuda-toolkit.sh [--print-env] [--cache DIR] [--compute-cap N]
#   --print-env        print `export` lines on stdout (for `eval "$(... --print-env)"`);
#                      progress goes to stderr either way
#   --cache DIR        cache directory (default $TIDEGATE_CUDA_CACHE, else
#                      ${XDG_CACHE_HOME:-$HOME/.cache}/tidegate-cuda/13.0)
#   --compute-cap N    GPU architecture the kernels are compiled for (default 90: H100/H200;
#                      80: A100, 89: L4/L40S)
#
# The pins: nvcc, crt and nvvm must be the same 13.0 release (unpinned, nvvm and crt resolve
# to a newer release whose PTX the 13.0 ptxas refuses: "Unsupported .version"), and cudarc
# 0.19's build script accepts CUDA up to 13.4. A toolkit from 13.0 makes PTX and machine code
# that driver 580 (CUDA 13.0) and newer load.
set -euo pipefail

PINS=(
  "nvidia-cuda-nvcc==13.0.88"
  "nvidia-cuda-crt==13.0.88"
  "nvidia-nvvm==13.0.88"
  "nvidia-cuda-runtime==13.0.96"
  "nvidia-cuda-cccl==13.0.85"
  "nvidia-cuda-nvrtc==13.0.88"
  "nvidia-cublas==13.0.2.14"
  "nvidia-curand==10.4.0.35"
)
# Libraries the engine links (cudarc's dynamic-linking) and their versioned names in the wheels.
LIBS=(cudart cublas cublasLt curand nvrtc)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "cuda-toolkit: error: $*" >&2; exit 1; }
say() { echo "cuda-toolkit: $*" >&2; }

print_env=0
cache="${TIDEGATE_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tidegate-cuda/13.0}"
cap=90
while [[ $# -gt 0 ]]; do
  case "$1" in
    --print-env) print_env=1 ;;
    --cache) [[ $# -ge 2 ]] || die "--cache needs a directory"; cache="$2"; shift ;;
    --compute-cap) [[ $# -ge 2 ]] || die "--compute-cap needs a number"; cap="$2"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done
[[ "$cap" =~ ^[0-9]+$ ]] || die "--compute-cap must be a number such as 90, not '$cap'"

command -v python3 >/dev/null || die "python3 is needed to install the toolkit wheels"
python3 -m pip --version >/dev/null 2>&1 \
  || die "python3 has no pip (Debian: apt-get install python3-pip)"
cc_bin="${CC:-cc}"
command -v "$cc_bin" >/dev/null || die "a C compiler ($cc_bin) is needed for the libcuda stub"

mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"
site="$cache/site"
tk="$cache/toolkit"
stamp="$cache/.installed"
want="$(printf '%s\n' "${PINS[@]}")"

cu="$site/nvidia/cu13"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$cu/bin/nvcc" ]]; then
  say "wheels already installed in $site"
else
  rm -rf "$site.new" "$tk" "$stamp"
  say "installing CUDA 13.0 wheels into $site (about 1.2 GB; a few minutes on first run)"
  # --no-deps: every dependency is pinned above, so nothing resolves to a newer release.
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
    --no-cache-dir --no-deps --no-compile --target "$site.new" "${PINS[@]}" \
    || die "pip could not install the CUDA wheels (${PINS[*]})"
  rm -rf "$site"
  mv "$site.new" "$site"
  [[ -x "$cu/bin/nvcc" ]] || die "the nvcc wheel has no $cu/bin/nvcc (wheel layout changed?)"
  "$cu/bin/nvcc" --version | grep -q 'release 13\.0' \
    || die "$cu/bin/nvcc is not release 13.0: $("$cu/bin/nvcc" --version | tail -1)"
  echo "$want" >"$stamp"
fi

if [[ -f "$tk/.complete" ]]; then
  say "toolkit folder already assembled: $tk"
else
  rm -rf "$tk" "$tk.new"
  mkdir -p "$tk.new/lib64"
  for d in bin include nvvm; do
    [[ -d "$cu/$d" ]] || die "the wheels have no $cu/$d"
    ln -s "$cu/$d" "$tk.new/$d"
  done
  for lib in "${LIBS[@]}"; do
    so=("$cu/lib/lib$lib.so".[0-9]*)
    [[ -e "${so[0]}" ]] || die "no lib$lib.so.* in $cu/lib (is its wheel in the pins?)"
    ln -s "${so[0]}" "$tk.new/lib64/lib$lib.so"
    ln -s "${so[0]}" "$tk.new/lib64/$(basename "${so[0]}")"
  done
  # The libcuda link-time stub: a shared object with the driver's SONAME that defines every
  # driver API function cuda.h declares (under both the plain and the _v2/_v3 names its macros
  # map to) as an empty function. It lets the linker resolve the symbols; it is never loaded.
  inc="$cu/include"
  [[ -f "$inc/cuda.h" ]] || die "no $inc/cuda.h (the nvidia-cuda-runtime wheel carries it)"
  {
    grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$inc/cuda.h"
    "$cc_bin" -E -P -I"$inc" "$inc/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
  } | tr -d '( \t' | sort -u | sed 's/.*/void &(void) {}/' >"$tk.new/libcuda-stub.c" \
    || die "could not list the driver API functions of $inc/cuda.h"
  n=$(wc -l <"$tk.new/libcuda-stub.c")
  [[ "$n" -gt 300 ]] || die "only $n driver API functions found in $inc/cuda.h"
  mkdir -p "$tk.new/lib64/stubs"
  "$cc_bin" -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tk.new/lib64/stubs/libcuda.so" \
    "$tk.new/libcuda-stub.c" || die "could not compile the libcuda stub with $cc_bin"
  rm "$tk.new/libcuda-stub.c"
  ln -s stubs/libcuda.so "$tk.new/lib64/libcuda.so"
  touch "$tk.new/.complete"
  mv "$tk.new" "$tk"
  say "assembled $tk: $("$tk/bin/nvcc" --version | grep release)"
fi

cat >"$cache/env.sh" <<EOF
# CUDA 13.0 toolkit for building tidegate-engine --features cuda (written by cuda-toolkit.sh).
export CUDA_ROOT="$tk"
export CUDA_PATH="$tk"
export CUDA_TOOLKIT_ROOT_DIR="$tk"
export CUDA_COMPUTE_CAP="$cap"
export PATH="$tk/bin:\${PATH}"
export LIBRARY_PATH="$tk/lib64\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
EOF
if [[ "$print_env" == 1 ]]; then
  grep '^export' "$cache/env.sh"
else
  say "environment written to $cache/env.sh; use it with:"
  echo ". $cache/env.sh"
fi
