# shellcheck shell=bash
# Sourced by e2e/cluster.sh: helm upgrade and helm uninstall, as docs/operations.md says they
# behave. An upgrade that changes a value rolls the operator and leaves the pools' pods alone;
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
pods_before=$(pool_pods)
gens_before=$(kubectl get deploy -A -l app.kubernetes.io/managed-by=tidegate-operator \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.generation} {end}')
if helm upgrade "$RELEASE" "$CHART" -n "$NS" --reuse-values --set logLevel=debug \
    --wait --timeout 5m >"$WORK/upgrade.txt" 2>&1; then
    pass "helm upgrade $RELEASE --set logLevel=debug (revision $(helm -n "$NS" history "$RELEASE" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["revision"])'))"
else
    fail "helm upgrade $RELEASE --set logLevel=debug" "$(tail -20 "$WORK/upgrade.txt")"
fi
check "the changed value took effect: the operator runs with RUST_LOG=debug" \
    bash -c '[ "$(kubectl -n '"$NS"' get deploy tidegate -o jsonpath="{.spec.template.spec.containers[0].env[?(@.name==\"RUST_LOG\")].value}")" = debug ] \
        && kubectl -n '"$NS"' rollout status deploy/tidegate --timeout=120s'
wait_for "the new operator pod holds the leader Lease" 90 lease_is_operators
sleep 10
check "the pools' engine and router pods were not touched (same pods, same uids)" \
    diff <(echo "$pods_before") <(pool_pods)
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
