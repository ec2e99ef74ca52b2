# shellcheck shell=bash
# Sourced by e2e/cluster.sh: helm upgrade and helm uninstall, as docs/operations.md says they
# behave. An upgrade to a new operator image that also changes a value rolls the operator and
# leaves the pools alone (the same pods, no restart, no admission change while it rolls);
# an uninstall removes the operator, its RBAC and policy, and leaves the CRDs, the pools and
# their workloads serving (Helm never deletes what crds/ installed); deleting a pool then
# removes everything the operator made for it (owner references).
echo "== helm upgrade"
# pool_pods: every engine and router pod of the example pools, with its uid.
pool_pods() {
    kubectl get pods -A -l 'app.kubernetes.io/managed-by=tidegate-operator' \
        -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.uid}{"\n"}{end}' | sort
}
operator_log_level() {
    kubectl -n "$NS" get deploy tidegate \
        -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="RUST_LOG")].value}'
}
# pool_restarts: the restart count of every container of the pools' pods.
pool_restarts() {
    kubectl get pods -A -l 'app.kubernetes.io/managed-by=tidegate-operator' \
        -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}'
}
# admission_states: each pool's admission state and since, as status has them.
admission_states() {
    kubectl get inferencepools.tidegate.dev -A \
        -o jsonpath='{range .items[*]}{.metadata.name}={.status.admission.state}@{.status.admission.since} {end}'
}
pods_before=$(pool_pods)
restarts_before=$(pool_restarts)
admission_before=$(admission_states)
gens_before=$(kubectl get deploy -A -l app.kubernetes.io/managed-by=tidegate-operator \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.generation} {end}')
# A "new" operator image: the same build under the next tag (no registry to push one to).
APP_VERSION=$(awk -F'"' '/^appVersion:/ {print $2}' "$CHART/Chart.yaml")
OPERATOR_REPO=$(awk '$1 == "repository:" {print $2; exit}' "$CHART/values.yaml")
NEXT_TAG=$APP_VERSION-next
check "the operator image tagged $OPERATOR_REPO:$NEXT_TAG in the node's containerd" \
    bash "$CLUSTER" tag "$OPERATOR_REPO:$APP_VERSION" "$OPERATOR_REPO:$NEXT_TAG"
(
    while [ ! -e "$WORK/upgrade-done" ]; do admission_states; echo; sleep 0.5; done
) >"$WORK/admission-during-upgrade.txt" 2>/dev/null &
SAMPLER=$!
if helm upgrade "$RELEASE" "$CHART" -n "$NS" --reuse-values --set image.tag="$NEXT_TAG" --set logLevel=debug \
    --wait --timeout 5m >"$WORK/upgrade.txt" 2>&1; then
    pass "helm upgrade $RELEASE --set image.tag=$NEXT_TAG --set logLevel=debug (revision $(helm -n "$NS" history "$RELEASE" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["revision"])'))"
else
    fail "helm upgrade $RELEASE to image $NEXT_TAG with logLevel=debug" "$(tail -20 "$WORK/upgrade.txt")"
fi
check "the changed value took effect: the operator runs with RUST_LOG=debug" \
    bash -c '[ "$(kubectl -n '"$NS"' get deploy tidegate -o jsonpath="{.spec.template.spec.containers[0].env[?(@.name==\"RUST_LOG\")].value}")" = debug ] \
        && kubectl -n '"$NS"' rollout status deploy/tidegate --timeout=120s'
# The old pod may still be listed (terminating) and still hold the Lease until it expires:
# wait for a holder that is not being deleted and runs the new image.
lease_is_new_operators() {
    local holder seen
    holder=$(lease_holder)
    [ -n "$holder" ] || return 1
    seen=$(kubectl -n "$NS" get pod "$holder" \
        -o jsonpath='{.metadata.deletionTimestamp}|{.spec.containers[0].image}' 2>/dev/null) || return 1
    [ "$seen" = "|$OPERATOR_REPO:$NEXT_TAG" ]
}
wait_for "the new operator pod, running the new image ($NEXT_TAG), holds the leader Lease" 90 lease_is_new_operators
sleep 10
touch "$WORK/upgrade-done"
wait "$SAMPLER"
check "the pools' engine and router pods were not touched (same pods, same uids)" \
    diff <(echo "$pods_before") <(pool_pods)
check "no pool container restarted during the upgrade" \
    bash -c '[ "$(kubectl get pods -A -l app.kubernetes.io/managed-by=tidegate-operator -o jsonpath="{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}")" = "'"$restarts_before"'" ]'
flaps=$(grep . "$WORK/admission-during-upgrade.txt" | sort -u | grep -vxF -- "$admission_before" | head -3 || true)
[ -z "$flaps" ] && pass "admission unchanged while the operator rolled ($(grep -c . "$WORK/admission-during-upgrade.txt") samples: $admission_before)" ||
    fail "admission unchanged while the operator rolled" "before: $admission_before; seen: $flaps"
check "the pools' Deployments were not changed (same generations)" bash -c \
    '[ "$(kubectl get deploy -A -l app.kubernetes.io/managed-by=tidegate-operator -o jsonpath="{range .items[*]}{.metadata.name}={.metadata.generation} {end}")" = "'"$gens_before"'" ]'
check_chat local/demo "tenant e2e (after the upgrade)" "x-tidegate-tenant: e2e" "x-tidegate-tier: standard"

echo "== helm uninstall"
if helm uninstall "$RELEASE" -n "$NS" --wait --timeout 2m >"$WORK/uninstall.txt" 2>&1; then
    pass "helm uninstall $RELEASE"
else
    fail "helm uninstall $RELEASE" "$(cat "$WORK/uninstall.txt")"
fi
no_operator() { [ -z "$(kubectl -n "$NS" get pods -l app.kubernetes.io/name=tidegate -o name 2>/dev/null)" ]; }
wait_for "the operator's pod is gone" 60 no_operator
check "its ClusterRoles, bindings and admission policy are gone" bash -c \
    '! kubectl get clusterrole tidegate >/dev/null 2>&1 && ! kubectl get clusterrolebinding tidegate >/dev/null 2>&1 \
        && ! kubectl get validatingadmissionpolicy tidegate-writes-only-its-own >/dev/null 2>&1'
check "the CRDs stay (Helm does not delete crds/), and so do the pools" \
    kubectl get crd/inferencepools.tidegate.dev crd/tierpolicies.tidegate.dev inferencepool/smollm2-chat -n inference
check "the pools' pods are untouched and keep serving without the operator" \
    diff <(echo "$pods_before") <(pool_pods)
check_chat inference/smollm2-chat "tenant acme (no operator running)" "authorization: Bearer example-acme-enterprise-key"

# Deleting a pool removes what the operator made for it, by owner references.
kubectl -n local delete inferencepool demo --wait=true --timeout=60s >/dev/null 2>&1 || true
demo_objects_gone() {
    [ -z "$(kubectl -n local get deploy,service,pdb,secret,configmap -l tidegate.dev/pool=demo -o name 2>/dev/null)" ] \
        && [ -z "$(kubectl -n local get pods -l tidegate.dev/pool=demo -o name 2>/dev/null)" ]
}
wait_for "deleting pool local/demo removes its Deployments, Services, PDBs, Secret, ConfigMaps and pods" 120 demo_objects_gone
kubectl delete inferencepools.tidegate.dev --all -A --wait=true --timeout=60s >/dev/null 2>&1 || true
check "deleting the CRDs (kubectl delete -f charts/tidegate/crds/) leaves no pool behind" \
    kubectl delete -f charts/tidegate/crds/ --wait=true --timeout=60s
