# shellcheck shell=bash
# Sourced by e2e/cluster.sh: the operator runs with exactly the chart's RBAC. A kubectl auth
# can-i matrix (e2e/cluster/rbac-matrix.txt) asks the API server's authorizer, as the
# operator's service account, what it may and may not do; then the chart's admission policy
# is tried: the operator may not write an object it does not manage, even where RBAC lets it.
echo "== RBAC, enforced: $SA"
AS=(--as="$SA" --as-group=system:serviceaccounts --as-group="system:serviceaccounts:$NS"
    --as-group=system:authenticated)
rbac_ok=0 rbac_bad=0
while read -r expect verb resource scope; do
    case $expect in yes | no) ;; *) continue ;; esac
    # shellcheck disable=SC2086
    if kubectl auth can-i "${AS[@]}" "$verb" "$resource" $scope >/dev/null 2>&1; then got=yes; else got=no; fi
    if [ "$got" = "$expect" ]; then
        rbac_ok=$((rbac_ok + 1))
    else
        rbac_bad=$((rbac_bad + 1))
        fail "can-i $verb $resource $scope: expected $expect, the API server says $got"
    fi
done <e2e/cluster/rbac-matrix.txt
if [ "$rbac_bad" = 0 ]; then
    pass "kubectl auth can-i matrix: all $rbac_ok answers as expected (it cannot list Secrets cluster-wide, exec into pods, or delete Deployments)"
fi
check "as the operator, listing Secrets cluster-wide is Forbidden" \
    bash -c "kubectl $(printf '%q ' "${AS[@]}") get secrets -A 2>&1 | grep -q Forbidden"

# The admission policy: a Deployment the operator does not manage, in a namespace it watches.
kubectl create namespace e2e-foreign >/dev/null 2>&1 || true
kubectl -n e2e-foreign create deployment foreign --image=tidegate.local/pause:1.0 --replicas=0 >/dev/null 2>&1 || true
refused_by_policy() {
    local out
    out=$(kubectl "${AS[@]}" "$@" 2>&1) && return 1
    grep -q "tidegate operator" <<<"$out"
}
wait_for "the admission policy refuses the operator a change to a Deployment it does not manage" 30 \
    refused_by_policy -n e2e-foreign annotate deployment foreign e2e=1
check "... and taking one over by adding its label" \
    refused_by_policy -n e2e-foreign label deployment foreign app.kubernetes.io/managed-by=tidegate-operator
check "... and creating one without its label" \
    refused_by_policy -n e2e-foreign create deployment other --image=x --dry-run=server
check "... but lets it create one of its own (labelled)" bash -c \
    "kubectl $(printf '%q ' "${AS[@]}") -n e2e-foreign create --dry-run=server -f - <<'YAML' >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: own, labels: {app.kubernetes.io/managed-by: tidegate-operator}}
spec:
  replicas: 0
  selector: {matchLabels: {app: own}}
  template:
    metadata: {labels: {app: own}}
    spec: {containers: [{name: c, image: x}]}
YAML"
kubectl delete namespace e2e-foreign --wait=false >/dev/null 2>&1 || true
