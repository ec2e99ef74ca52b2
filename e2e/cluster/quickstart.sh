# shellcheck shell=bash
# Sourced by e2e/cluster.sh: the quickstart of docs/operations.md ("Try it on a local
# cluster"), the block after its `<!-- quickstart: ... -->` marker, run line by line in this
# shell as a user would type it. Two substitutions, printed: the debug build CI has for
# `target/release/` (and TIDEGATE_IMAGE_PROFILE=debug for `images`), and CARGO_TARGET_DIR
# for `target/` when it is set. The first line that fails stops the e2e.
quickstart_lines() {
    awk '/<!-- quickstart:/ {marked = 1; next}
         marked && !inblock && /^```sh/ {inblock = 1; next}
         inblock && /^```/ {exit}
         inblock && !/^[[:space:]]*(#|$)/ {print}' docs/operations.md
}
echo "== the quickstart of docs/operations.md, line by line"
QS_TARGET=${CARGO_TARGET_DIR:-target}
export TIDEGATE_IMAGE_PROFILE=${TIDEGATE_IMAGE_PROFILE:-debug}
echo "   (target/release/ runs as $QS_TARGET/$TIDEGATE_IMAGE_PROFILE/; images with TIDEGATE_IMAGE_PROFILE=$TIDEGATE_IMAGE_PROFILE)"
mapfile -t QS_LINES < <(quickstart_lines)
if [ "${#QS_LINES[@]}" -lt 10 ]; then
    fail "docs/operations.md has its quickstart block (found ${#QS_LINES[@]} lines)"
    summary
    exit 1
fi
for qs_line in "${QS_LINES[@]}"; do
    qs_run=${qs_line//target\/release\//$QS_TARGET/$TIDEGATE_IMAGE_PROFILE/}
    t0=$SECONDS
    if eval "$qs_run" >"$WORK/qs.out" 2>&1; then
        pass "\$ ${qs_line:0:150}$([ ${#qs_line} -gt 150 ] && echo ' …') ($((SECONDS - t0))s)"
        case $qs_line in
            "kubectl get"* | curl*) sed 's/^/       /' "$WORK/qs.out" | head -20 && echo ;;
        esac
    else
        fail "\$ $qs_line" "$(tail -30 "$WORK/qs.out"; wait_context)"
        summary
        exit 1
    fi
done
