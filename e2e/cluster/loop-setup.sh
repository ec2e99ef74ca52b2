# shellcheck shell=bash
# Sourced by e2e/cluster-loop.sh: Prometheus on the node, the chart, the pool and its tiers,
# and the files the load generator reads (the pool's Service, the engine pods' addresses).

# ---- Prometheus on the node: Kubernetes pod discovery with the cluster's kubeconfig, kept to
# what the chart's engineMonitor PodMonitor selects, with the labels it sets.
# The cluster's own (scripts/cluster.sh env puts it first on PATH): Debian unstable's, with
# Kubernetes discovery.
PROM_BIN=$(command -v prometheus || true)
read -r PROM_PORT < <(listen_ports 1)
cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: tidegate-engines
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: $KUBECONFIG
        namespaces: {names: [$NS]}
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: tidegate-engine, action: keep}
      - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: http, action: keep}
      - {source_labels: [__meta_kubernetes_pod_label_tidegate_dev_pool], target_label: pool}
      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
EOF
if [ -x "$PROM_BIN" ] && start_prometheus 0.0.0.0; then
    pass "Prometheus $("$PROM_BIN" --version 2>&1 | head -1 | awk '{print $3}') on the node at $NODE_IP:$PROM_PORT, discovering pods through the cluster's API"
else
    fail "Prometheus started" "$(tail -20 "$WORK/prometheus.log" 2>/dev/null)"
fi

# ---- The chart: the operator reads Prometheus at the node's address.
if helm upgrade --install tidegate charts/tidegate -n "$OPNS" --create-namespace \
    --set prometheus.url="http://$NODE_IP:$PROM_PORT" --wait --timeout 5m >"$WORK/helm.txt" 2>&1; then
    pass "helm upgrade --install tidegate (prometheus.url http://$NODE_IP:$PROM_PORT)"
else
    fail "helm upgrade --install tidegate" "$(tail -20 "$WORK/helm.txt")"
fi

# ---- The pool, its tiers and its model volume.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: tidegate-models-e2e-loop}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: $NS, name: model-weights}
  hostPath: {path: $MODELS, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: model-weights, namespace: $NS}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: tidegate-models-e2e-loop
  resources: {requests: {storage: 1Gi}}
EOF
loop_pool_manifests "pvc://model-weights/tiny-random" "    startupGracePeriod: 2m
    extraArgs: [\"--threads\", \"1\"]" "{source: Prometheus, rateWindow: 5s, staleAfter: 8s}" \
    | kubectl apply -f - >/dev/null
check "the namespace, model volume, TierPolicy and InferencePool applied" kubectl -n "$NS" get inferencepool "$POOL"

jp() { kubectl -n "$NS" get inferencepool "$POOL" -o jsonpath="$1" 2>/dev/null; }
is() { [ "$(jp "$1")" = "$2" ]; }
ge() { [ "$(jp "$1")" -ge "$2" ] 2>/dev/null; }
operator_pod() { kubectl -n "$OPNS" get pods -l app.kubernetes.io/name=tidegate --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
# What a timed-out wait_for prints: the pool's status, its pods, the operator's log tail.
wait_context() {
    kubectl -n "$NS" get inferencepool "$POOL" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
    kubectl -n "$NS" get pods -o wide
    echo "--- operator log (tail):"
    kubectl -n "$OPNS" logs "$(operator_pod)" --tail=8 2>&1 | grep -o '"message":"[^"]*"[^}]*"decision":"[^"]*"\|"message":"[^"]*"' | cut -c1-250
}
# engine_pods: the pool's engine pods, "name ip ready deletionCost" a line.
engine_pods() {
    kubectl -n "$NS" get pods -l "app.kubernetes.io/name=tidegate-engine,tidegate.dev/pool=${1:-$POOL}" \
        -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.status.containerStatuses[0].ready} {.metadata.annotations.controller\.kubernetes\.io/pod-deletion-cost}{"\n"}{end}' 2>/dev/null
}
# The files load.py reads: the pool's front door (its Service) and the engine pods, refreshed
# every second (the targets of direct streams), as Prometheus' file_sd would list them.
SVC_IP=$(kubectl -n "$NS" get service "$POOL" -o jsonpath='{.spec.clusterIP}' 2>/dev/null)
until [ -n "$SVC_IP" ]; do
    sleep 1
    SVC_IP=$(kubectl -n "$NS" get service "$POOL" -o jsonpath='{.spec.clusterIP}' 2>/dev/null)
done
printf '[{"pool": "%s", "url": "http://%s:8000"}]\n' "$POOL" "$SVC_IP" >"$ROUTERS"
echo '[]' >"$TARGETS"
(
    while [ ! -e "$WORK/stop-targets" ]; do
        engine_pods | awk '$2 != "" && $3 == "true" {printf "%s\"%s:8000\"", sep, $2; sep=", "}' \
            | sed 's/^/[{"targets": [/; s/$/]}]/' >"$TARGETS.new" && mv "$TARGETS.new" "$TARGETS"
        sleep 1
    done
) &
PIDS+=("$!")
