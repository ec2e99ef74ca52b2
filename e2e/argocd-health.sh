#!/usr/bin/env bash
# Argo CD health-check test: runs examples/argocd/health/*.lua in a real Lua interpreter
# (Lua 5.4, and Lua 5.1 too when it can be had: Argo CD embeds a Lua 5.1 VM) against the status
# fixtures in e2e/argocd/fixtures, each with its expected health status and message.
#
#   bash e2e/argocd-health.sh
#
# Also checks that the argocd-cm snippet (examples/argocd/argocd-cm-health.yaml) embeds exactly
# the tested Lua files, and that the runner does report a wrong expectation.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. e2e/lib/common.sh

HEALTH=examples/argocd/health
CM=examples/argocd/argocd-cm-health.yaml
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

apt_need lua5.4 lua5.4
# Lua 5.1 is optional: the closest thing here to Argo CD's gopher-lua.
if ! command -v lua5.1 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lua5.1 >/dev/null 2>&1 || true
fi

say "argocd-cm snippet embeds the tested scripts"
# embedded KEY: the block scalar under data.KEY, de-indented, trailing blank lines dropped.
embedded() {
  awk -v key="  $1: |" '
    $0 == key { on = 1; next }
    on && /^    / { sub(/^    /, ""); buf = buf $0 "\n"; if ($0 != "") { out = out buf; buf = "" } next }
    on && /^$/ { buf = buf "\n"; next }
    on { exit }
    END { printf "%s", out }
  ' "$CM"
}
for pair in InferencePool:inferencepool TierPolicy:tierpolicy; do
  kind=${pair%%:*} file=$HEALTH/${pair##*:}.lua
  embedded "resource.customizations.health.tidegate.dev_$kind" > "$TMP/$kind.lua"
  [ -s "$TMP/$kind.lua" ] || die "$CM has no resource.customizations.health.tidegate.dev_$kind"
  diff -u "$file" "$TMP/$kind.lua" || die "$CM differs from $file (re-embed the file)"
  ok "tidegate.dev_$kind == $file ($(wc -l < "$file") lines)"
done

run_all() { # run_all LUA
  say "fixtures with $1"
  (cd e2e/argocd && "$1" run.lua "$ROOT/$HEALTH" fixtures/*.lua) || die "health checks differ from the fixtures under $1"
}
run_all lua5.4
if command -v lua5.1 >/dev/null 2>&1; then
  run_all lua5.1
else
  echo "   lua5.1 not available: ran with Lua 5.4 only"
fi

say "the runner reports a wrong expectation"
sed 's/status = "Healthy"/status = "Degraded"/' e2e/argocd/fixtures/inferencepool-healthy.lua > "$TMP/wrong.lua"
if (cd e2e/argocd && lua5.4 run.lua "$ROOT/$HEALTH" "$TMP/wrong.lua") > "$TMP/wrong.out" 2>&1; then
  cat "$TMP/wrong.out"; die "a wrong expectation passed"
fi
ok "$(grep -c '^FAIL' "$TMP/wrong.out") mismatch reported as FAIL, exit status non-zero"

say "argocd health: all checks passed"
