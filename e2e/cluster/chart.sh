# shellcheck shell=bash
# Sourced by e2e/cluster.sh: the chart, by real Helm, on the real API server (the quickstart
# installed it; here: lint, template against the server, and what the install must give).
echo "== the chart, by Helm $(helm version --template '{{.Version}}' 2>/dev/null)"
CHART=charts/tidegate
check "helm lint $CHART" helm lint "$CHART"
check "helm lint refuses a value the schema forbids (replicaCount: -1)" \
    bash -c "! helm lint $CHART --set replicaCount=-1 >/dev/null 2>&1"
if helm template "$RELEASE" "$CHART" -n "$NS" >"$WORK/template.yaml" 2>"$WORK/template.err" \
    && kubectl apply --dry-run=server -n "$NS" -f "$WORK/template.yaml" >"$WORK/dry-run.txt" 2>&1; then
    pass "helm template | kubectl apply --dry-run=server: $(grep -c 'server dry run' "$WORK/dry-run.txt") objects accepted"
else
    fail "helm template | kubectl apply --dry-run=server" "$(cat "$WORK/template.err" "$WORK/dry-run.txt" 2>/dev/null | tail -20)"
fi
if helm -n "$NS" status "$RELEASE" >"$WORK/status.txt" 2>&1 && grep -q 'STATUS: deployed' "$WORK/status.txt"; then
    pass "helm status $RELEASE: deployed ($(grep -o 'REVISION: .*' "$WORK/status.txt"))"
else
    fail "helm status $RELEASE" "$(cat "$WORK/status.txt")"
fi
check "the CRDs are installed and established" kubectl wait --for=condition=Established --timeout=60s \
    crd/inferencepools.tidegate.dev crd/tierpolicies.tidegate.dev
check "the operator Deployment is Ready" kubectl -n "$NS" rollout status deploy/tidegate --timeout=120s
operator_pod() { kubectl -n "$NS" get pods -l app.kubernetes.io/name=tidegate -o jsonpath='{.items[0].metadata.name}'; }
lease_holder() { kubectl -n "$NS" get lease tidegate-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
lease_is_operators() { [ -n "$(lease_holder)" ] && [ "$(lease_holder)" = "$(operator_pod)" ]; }
wait_for "its leader Lease is held by the operator pod" 60 lease_is_operators
echo "       lease tidegate-operator held by $(lease_holder)"
