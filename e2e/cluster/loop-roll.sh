# shellcheck shell=bash
# Sourced by e2e/cluster/loop-steps.sh with the pool at 3 engine pods under load: a pool spec
# change that alters the engine pod template (its drain grace, hence the pods'
# terminationGracePeriodSeconds and --drain-grace) rolls the engines one at a time (the
# Deployment's maxSurge 0, maxUnavailable 1), each old pod leaving the routers' set as its
# deletion starts and draining before it exits: the load loses nothing (losses.py checks the
# window) and admission does not change while it rolls.

echo "   -- a pool template change rolls the engines"
old_pods=$(engine_pods | awk '{print $1}' | sort)
admission_at_start=$(jp '{.status.admission.state}')
ROLL_START=$(date +%s.%N)
kubectl -n "$NS" patch inferencepool "$POOL" --type merge -p '{"spec":{"engine":{"drainGracePeriod":"45s"}}}' >/dev/null
# rolled: no old pod left, three new ones Ready.
rolled() {
    local now
    now=$(engine_pods)
    [ -z "$(comm -12 <(echo "$old_pods") <(awk '{print $1}' <<<"$now" | sort))" ] &&
        [ "$(awk '$3 == "true"' <<<"$now" | grep -c .)" = 3 ]
}
min_ready=3 states="" t0=$SECONDS
until rolled || [ $((SECONDS - t0)) -ge 240 ]; do
    ready=$(engine_pods | awk '$3 == "true"' | grep -c .)
    [ "$ready" -lt "$min_ready" ] && min_ready=$ready
    states=$(printf '%s\n%s\n' "$states" "$(jp '{.status.admission.state}')" | grep . | sort -u)
    sleep 0.5
done
ROLL_END=$(date +%s.%N)
FAULTS+=("$ROLL_START $ROLL_END template-roll")
if rolled; then
    pass "the engine pods rolled to the new template ($((SECONDS - t0)) s; at least $min_ready of 3 Ready throughout)"
else
    fail "the engine pods rolled to the new template" "$(engine_pods)"
fi
[ "$min_ready" -ge 2 ] && pass "one engine at a time: never fewer than 2 of 3 Ready" ||
    fail "one engine at a time: never fewer than 2 of 3 Ready" "$min_ready Ready at the lowest"
[ "$states" = "$admission_at_start" ] && pass "admission unchanged while the engines rolled ($admission_at_start)" ||
    fail "admission unchanged while the engines rolled" "before: $admission_at_start; seen: $(echo "$states" | tr '\n' ' ')"
