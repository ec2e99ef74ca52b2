#!/usr/bin/env bash
# Chart test: render charts/tidegate with Helm (`helm template`, `helm lint`), with the default
# values and with a non-default values file, and check what comes out. Helm is the one
# scripts/cluster.sh builds (`scripts/cluster.sh install`); e2e/cluster.sh installs the chart
# with it on a real cluster.
#
#   bash e2e/chart.sh
#
# Checks, in order:
#   1. charts/tidegate/crds/ equals crds/ (both generated from operator/api).
#   2. values.yaml, and values.yaml + the custom values file, validate against
#      values.schema.json (here, and by Helm, which refuses the bad values too).
#   3. `helm lint --strict` (a reference to a value that does not exist is an error, NOTES.txt
#      rendered) and `helm template` with default values and with
#      e2e/fixtures/chart-values-custom.yaml; inconsistent values are refused with a clear error.
#   4. Every rendered object validates against the Kubernetes 1.36 schemas (strict: unknown
#      fields are errors). The prometheus-operator kinds (ServiceMonitor, PodMonitor,
#      PrometheusRule) are not in those schemas and their CRDs are not available here: they are
#      checked structurally instead (selectors hit the rendered Service, ports exist), and the
#      PrometheusRule's groups go through `promtool check rules`.
#   5. Security and RBAC invariants of the operator objects.
#   6. The Dockerfiles build workspace packages' release binaries, run as non-root, and the
#      chart's default image is the one docker/Dockerfile.operator builds (not built here).
#   7. With KUBECONFIG set (or CHART_E2E_APISERVER=1, which starts a private test API server):
#      the chart's CRDs are applied to that API server, become Established, and the example
#      pool and tier policy are accepted by it (server-side dry run).
#
# Environment: K8S_TESTENV (path of the k8s-testenv script; default ../shared/testenv/k8s-testenv
# relative to the repo root), KUBECONFIG, CHART_E2E_APISERVER.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. e2e/lib/common.sh

CHART=charts/tidegate
CUSTOM=e2e/fixtures/chart-values-custom.yaml
STATE=$ROOT/.e2e-state/chart
OUT=$STATE/out
mkdir -p "$STATE"
rm -rf "$OUT" && mkdir -p "$OUT"
[ -x "$K8S_TESTENV" ] || die "k8s-testenv not found at $K8S_TESTENV (set K8S_TESTENV)"
T=$K8S_TESTENV
# Only the cluster's tools on PATH: its KUBECONFIG would point step 7 at a cluster that may not run.
command -v helm >/dev/null 2>&1 || eval "$(scripts/cluster.sh env | grep '^export PATH=')"
command -v helm >/dev/null 2>&1 || die "helm not found: run scripts/cluster.sh install (it builds helm from the Go module proxy)"
PY=$(py_env "$STATE/pyenv" pyyaml jsonschema)
CHECK=("$PY" e2e/chart_check.py)
apt_need promtool prometheus

say "1. chart CRDs equal crds/"
diff -ru crds "$CHART/crds" || die "$CHART/crds differs from crds/: run \`tidegate-operator crds\`"
ok "$(cd crds && echo *.yaml) identical"

say "2. values.schema.json"
"${CHECK[@]}" schema "$CHART/values.schema.json" "$CHART/values.yaml"
"${CHECK[@]}" schema "$CHART/values.schema.json" "$CHART/values.yaml" "$CUSTOM"
printf 'replicaCount: "two"\nlogFormat: xml\nwatchNamespaces: [Bad_NS]\nnope: 1\n' > "$OUT/bad-values.yaml"
if "${CHECK[@]}" schema "$CHART/values.schema.json" "$CHART/values.yaml" "$OUT/bad-values.yaml" 2>"$OUT/bad-values.err"; then
  die "values.schema.json accepted bad values"
fi
ok "bad values refused with $(wc -l < "$OUT/bad-values.err") errors:"
sed 's/^FAIL: values [^:]*: /     /' "$OUT/bad-values.err"
if helm lint "$CHART" -f "$OUT/bad-values.yaml" >"$OUT/helm-bad-values.txt" 2>&1; then
  die "helm lint accepted the bad values"
fi
ok "helm refuses them too: $(grep -o 'values don.t meet the specifications.*' "$OUT/helm-bad-values.txt" | head -1 | cut -c1-80)"

say "3. render ($(helm version --template '{{.Version}}'))"
helm lint --strict "$CHART" -n tidegate-system > "$OUT/lint-default.txt" 2>&1 \
  || { cat "$OUT/lint-default.txt"; die "helm lint --strict with default values failed"; }
helm lint --strict "$CHART" -n tidegate-system -f "$CUSTOM" > "$OUT/lint-custom.txt" 2>&1 \
  || { cat "$OUT/lint-custom.txt"; die "helm lint --strict with $CUSTOM failed"; }
ok "helm lint --strict: default and custom values (templates and NOTES.txt render, no missing value)"
helm template tidegate "$CHART" -n tidegate-system --include-crds > "$OUT/default.yaml" \
  || die "helm template with default values failed"
helm template tg "$CHART" -n tidegate-system -f "$CUSTOM" --include-crds > "$OUT/custom.yaml" \
  || die "helm template with $CUSTOM failed"
for v in default custom; do
  ok "$v values: $(grep -c '^kind:' "$OUT/$v.yaml") objects ($(awk '/^kind:/{print $2}' "$OUT/$v.yaml" | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}'))"
done
refuse() { # refuse WHAT EXPECTED_MESSAGE HELM_ARGS...
  local what=$1 want=$2; shift 2
  if helm template "$CHART" "$@" >/dev/null 2>"$OUT/refuse.err"; then
    die "helm template accepted $what"
  fi
  grep -q -- "$want" "$OUT/refuse.err" || die "helm refused $what without saying '$want': $(cat "$OUT/refuse.err")"
  ok "refuses $what: $(grep -o -- "$want.*" "$OUT/refuse.err" | head -1 | cut -c1-90)"
}
refuse "2 replicas without leader election" "needs leaderElection.enabled=true" \
  --set replicaCount=2,leaderElection.enabled=false
refuse "a ServiceMonitor without the metrics Service" "needs metrics.service.enabled" \
  --set serviceMonitor.enabled=true,metrics.service.enabled=false
refuse "an empty prometheus.url (the schema)" "/prometheus/url.: .. does not match" --set prometheus.url=
"${CHECK[@]}" crds "$OUT/default.yaml" crds

say "4. schema validation of every rendered object"
for v in default custom; do
  echo " $v:"
  "${CHECK[@]}" split "$OUT/$v.yaml" "$OUT/$v-core.yaml" "$OUT/$v-rules.yaml"
  "$T" validate --quiet "$OUT/$v-core.yaml" > "$OUT/$v-validate.txt" 2>&1 \
    || { cat "$OUT/$v-validate.txt"; die "$v: kubernetes schema validation failed"; }
  ok "$v: $(grep -c '^kind:' "$OUT/$v-core.yaml") objects valid against the Kubernetes 1.36 schemas (strict)"
  if grep -q 'alert:' "$OUT/$v-rules.yaml"; then
    promtool check rules "$OUT/$v-rules.yaml" > "$OUT/$v-promtool.txt" 2>&1 \
      || { cat "$OUT/$v-promtool.txt"; die "$v: the PrometheusRule's rules do not load"; }
    ok "$v: PrometheusRule groups load with promtool ($(grep -o 'SUCCESS.*' "$OUT/$v-promtool.txt"))"
  fi
done
echo "   ServiceMonitor/PodMonitor/PrometheusRule: no Kubernetes schema and no CRD for them here;"
echo "   checked structurally above, not against the prometheus-operator CRDs."

echo " examples:"
"$T" validate --quiet examples/argocd/argocd-cm-health.yaml > "$OUT/argocd-cm-validate.txt" 2>&1 \
  || { cat "$OUT/argocd-cm-validate.txt"; die "examples/argocd/argocd-cm-health.yaml is not a valid ConfigMap"; }
ok "examples/argocd/argocd-cm-health.yaml is a valid ConfigMap (the Argo CD Applications are CRD kinds: not checked here)"

say "5. security and RBAC invariants"
"${CHECK[@]}" invariants "$OUT/default.yaml" cluster
"${CHECK[@]}" invariants "$OUT/custom.yaml" namespaced

say "6. images (the Dockerfiles checked here; scripts/cluster.sh images builds them for e2e/cluster.sh)"
REPO=$(awk '/^image:/{on=1} on && /repository:/{print $2; exit}' "$CHART/values.yaml")
grep -q -- "-t $REPO:" docker/Dockerfile.operator || die "chart image $REPO is not what docker/Dockerfile.operator builds"
for f in docker/Dockerfile.operator docker/Dockerfile.engine; do
  for pkg in $(grep -o -- '-p [a-z0-9-]*' "$f" | awk '{print $2}' | sort -u); do
    grep -q "^name = \"$pkg\"" operator/Cargo.toml engine/Cargo.toml operator/api/Cargo.toml \
      || die "$f builds package $pkg, which is not in the workspace"
    grep -q "target/release/$pkg /out/$pkg" "$f" || die "$f does not take the release binary of $pkg"
  done
  grep -q '^USER 65532:65532' "$f" || die "$f: runtime image must run as uid 65532 (non-root)"
done
ok "chart image $REPO is built by docker/Dockerfile.operator; both Dockerfiles build workspace packages' release binaries and run as uid 65532"

say "7. CRDs on a real API server"
STARTED=
if [ -z "${KUBECONFIG:-}" ] && [ "${CHART_E2E_APISERVER:-}" = 1 ]; then
  export K8S_TESTENV_STATE=$STATE/apiserver
  eval "$("$T" start)"
  STARTED=1
  trap '"$T" stop --purge >/dev/null 2>&1 || true' EXIT
fi
if [ -n "${KUBECONFIG:-}" ]; then
  KC=$KUBECONFIG
  command -v kubectl >/dev/null 2>&1 || eval "$("$T" env)"
  export KUBECONFIG=$KC
  kubectl apply --server-side --force-conflicts -f "$CHART/crds/" | sed 's/^/   /'
  kubectl wait --for condition=Established --timeout=60s \
    crd/inferencepools.tidegate.dev crd/tierpolicies.tidegate.dev | sed 's/^/   /'
  kubectl apply --dry-run=server -f examples/tierpolicy-three-tiers.yaml -f examples/inferencepool-llama-8b.yaml \
    | sed 's/^/   /'
  kubectl get --raw /apis/tidegate.dev/v1alpha1 | grep -q '"inferencepools/scale"' \
    || die "the API server does not serve inferencepools/scale"
  ok "CRDs applied and Established on the API server${STARTED:+ (started for this test)}; examples accepted (dry run)"
else
  echo "   skipped: KUBECONFIG is not set (set it, or CHART_E2E_APISERVER=1 to start a test API server)"
fi

say "chart: all checks passed"
