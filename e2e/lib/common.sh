# shellcheck shell=bash
# Shared helpers for the e2e shell scripts. Source it; it expects ROOT to be the repo root.

# The k8s-testenv script: $K8S_TESTENV, else ../shared/testenv/k8s-testenv next to the repo.
K8S_TESTENV=${K8S_TESTENV:-$ROOT/../shared/testenv/k8s-testenv}

say()  { printf '== %s\n' "$*"; }
ok()   { printf '   ok: %s\n' "$*"; }
die()  { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# apt_need CMD PKG...: make CMD available, installing the Debian packages if it is missing.
# CI runs on a fresh Debian machine as root; elsewhere a missing tool is a clear error.
apt_need() {
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $* (for $cmd)"
    if [ -z "${_APT_UPDATED:-}" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
      _APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
      || die "apt-get install $* failed"
  fi
  command -v "$cmd" >/dev/null 2>&1 || die "$cmd is needed (Debian: apt-get install $*)"
}

# py_env DIR PKG...: a Python virtualenv under DIR with PKGs, reused when already there.
# Prints the path of its python.
py_env() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c 'import yaml, jsonschema' 2>/dev/null; then
    apt_need python3 python3 python3-venv
    rm -rf "$dir"
    if ! python3 -m venv "$dir" >/dev/null 2>&1; then
      [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$dir" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    "$dir/bin/pip" install -q --disable-pip-version-check "$@" >&2 || die "pip install $* failed"
  fi
  echo "$dir/bin/python"
}
