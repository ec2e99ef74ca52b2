#!/usr/bin/env bash
# The README's first command, checked: `tidegate-operator local` on examples/local/ (engine
# processes serving the random-weight model, the real control loop, the built-in tidal load,
# at half the demo's time scale) must scale to the pool's maximum, pause new tenants at the
# ceiling, reopen after the hold time, scale back down to replicas.min, and lose no request
# to a connection error on the way.
#
# Environment: E2E_PROFILE (debug | release; default debug), CARGO_TARGET_DIR.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT" || exit 1

PROFILE=${E2E_PROFILE:-debug}
TARGET=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tidegate-e2e-local.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "== local mode: the README's demo (examples/local/, --time-scale 0.5)"
build_binaries "$PROFILE" || exit 1
BIN="$TARGET/$PROFILE"
OUT="$WORK/local.out"
"$BIN/tidegate-operator" local -f examples/local/ --engine-bin "$BIN/tidegate-engine" \
    --time-scale 0.5 --state-dir "$WORK/state" >"$OUT" 2>&1
rc=$?
tail -20 "$OUT" | sed 's/^/       | /'

check "local mode exits 0 (the pool settled after the load)" test "$rc" -eq 0
max=$(awk '/^  *max:/ {print $2; exit}' examples/local/pool.yaml)
check "scaled up to the pool's maximum ($max)" grep -q "^peak replicas: *$max\$" "$OUT"
check "new tenants paused at the ceiling" grep -q "event Warning NewTenantsPaused" "$OUT"
check "new tenants of pausable tiers refused with 503" \
    grep -Eq "refused/503/new_tenant_admission_paused/new +[1-9]" "$OUT"
check "admission reopened after the hold time" grep -q "event Normal AdmissionReopened" "$OUT"
check "scaled back down to replicas.min" grep -q "event Normal ScaledDown: 2 → 1 replicas" "$OUT"
check "up to the maximum and back without a reversal ($(sed -n 's/^replica path: *//p' "$OUT"))" \
    grep -q "^replica path: .*(no reversal)\$" "$OUT"
check "existing tenants served throughout" grep -Eq "served/existing/enterprise +[1-9]" "$OUT"
check "the load went through the router, whose summary reports affinity hits" \
    grep -Eq "^router affinity: +[1-9][0-9]* session hits" "$OUT"
check "the summary reports KV restores avoided and held requests" \
    bash -c "grep -q '^KV restores avoided:' '$OUT' && grep -q '^held requests:' '$OUT'"
if grep -Eq "^  error/" "$OUT"; then
    fail "no request lost to a connection error" "$(grep -E '^  error/' "$OUT")"
else
    pass "no request lost to a connection error"
fi
summary
