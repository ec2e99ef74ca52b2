#!/usr/bin/env bash
# PromQL test: every expression in the Grafana dashboard and the alerting rules parses.
#
#   bash e2e/promql.sh
#
# 1. The alert rule file loads with `promtool check rules` (PromQL, durations, labels, and the
#    Go templates in annotations).
# 2. Every expression of the dashboard (panels, annotations, variable queries, with Grafana's
#    variables replaced) becomes a recording rule, checked the same way. A deliberately broken
#    expression is checked too, and must be refused.
# 3. When a Prometheus 3 server binary is at hand ($PROMETHEUS, the one the k8s-testenv script
#    provides, or `prometheus` on PATH), a throwaway instance on 127.0.0.1 loads the alert
#    rules (all must load and evaluate without error) and parses every expression through
#    /api/v1/parse_query, so the check also holds for the parser of current Prometheus.
#
# 4. Every tidegate_* metric they use is listed in the metrics reference (docs/operations.md).
#
# Exits non-zero on any parse failure. Environment: PROMETHEUS, K8S_TESTENV.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
. e2e/lib/common.sh

RULES=charts/tidegate/alerts/tidegate-alerts.yaml
DASHBOARDS=(charts/tidegate/dashboards/*.json)
# shellcheck disable=SC2016 # a literal Grafana variable
BROKEN='sum by (pool (rate(tidegate_engine_decode_tokens_total[$__rate_interval]))'
TMP=$(mktemp -d)
PROM_PID=
cleanup() {
  if [ -n "$PROM_PID" ]; then kill "$PROM_PID" 2>/dev/null || true; wait "$PROM_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

apt_need python3 python3
apt_need curl curl
apt_need promtool prometheus

say "1. alert rules with promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}')"
promtool check rules "$RULES" > "$TMP/rules-promtool.txt" 2>&1 \
  || { cat "$TMP/rules-promtool.txt"; die "$RULES does not load"; }
ok "$RULES: $(grep -o 'SUCCESS.*' "$TMP/rules-promtool.txt")"
N_RULES=$(grep -cE '^ *- (alert|record):' "$RULES")

say "2. dashboard expressions with promtool"
: > "$TMP/all-exprs.jsonl"
for d in "${DASHBOARDS[@]}"; do
  base=$(basename "$d" .json)
  python3 e2e/promql_extract.py "$d" "$TMP/$base-rules.yaml" "$TMP/$base-exprs.jsonl" || die "$d: bad dashboard"
  cat "$TMP/$base-exprs.jsonl" >> "$TMP/all-exprs.jsonl"
  if ! promtool check rules "$TMP/$base-rules.yaml" > "$TMP/$base-promtool.txt" 2>&1; then
    cat "$TMP/$base-promtool.txt"
    # Name the dashboard queries behind the failing recording rules.
    for r in $(grep -o 'dashboard:expr_[0-9]*' "$TMP/$base-promtool.txt" | sort -u); do
      sed -n "$(( ${r#dashboard:expr_} + 1 ))p" "$TMP/$base-exprs.jsonl"
    done
    die "$d: a PromQL expression does not parse"
  fi
  ok "$d: $(grep -o 'SUCCESS.*' "$TMP/$base-promtool.txt")"
done
# The check itself: a broken expression in a dashboard must be refused.
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
p = next(p for p in d["panels"] if p.get("targets"))
p["targets"][0]["expr"] = sys.argv[3]
json.dump(d, open(sys.argv[2], "w"))' "${DASHBOARDS[0]}" "$TMP/broken.json" "$BROKEN"
python3 e2e/promql_extract.py "$TMP/broken.json" "$TMP/broken-rules.yaml" "$TMP/broken-exprs.jsonl" >/dev/null
if promtool check rules "$TMP/broken-rules.yaml" > "$TMP/broken.txt" 2>&1; then
  die "promtool accepted a broken expression: this test would not catch one"
fi
ok "a broken expression is refused: $(grep -o 'parse error.*' "$TMP/broken.txt" | head -1)"

say "3. Prometheus server parser"
PROM=${PROMETHEUS:-}
if [ -z "$PROM" ] && [ -x "$K8S_TESTENV" ]; then
  PROM=$( (eval "$("$K8S_TESTENV" env 2>/dev/null)"; command -v prometheus) || true)
fi
[ -n "$PROM" ] || PROM=$(command -v prometheus || true)
if [ -z "$PROM" ]; then
  echo "   skipped: no Prometheus server binary (set PROMETHEUS)"
else
  VERSION=$("$PROM" --version 2>&1 | head -1 | awk '{print $3}')
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  printf 'global:\n  evaluation_interval: 1s\nrule_files:\n  - %s\n' "$ROOT/$RULES" > "$TMP/prometheus.yml"
  "$PROM" --config.file="$TMP/prometheus.yml" --web.listen-address="127.0.0.1:$PORT" \
    --storage.tsdb.path="$TMP/data" > "$TMP/prometheus.log" 2>&1 &
  PROM_PID=$!
  URL=http://127.0.0.1:$PORT
  for _ in $(seq 1 150); do
    curl -fsS "$URL/-/ready" >/dev/null 2>&1 && break
    kill -0 "$PROM_PID" 2>/dev/null || { tail -20 "$TMP/prometheus.log"; die "Prometheus $VERSION exited: the rules do not load"; }
    sleep 0.2
  done
  curl -fsS "$URL/-/ready" >/dev/null || { tail -20 "$TMP/prometheus.log"; die "Prometheus did not become ready"; }
  if ! curl -fsS "$URL/api/v1/parse_query" --data-urlencode 'query=up' >/dev/null 2>&1; then
    echo "   skipped: Prometheus $VERSION has no /api/v1/parse_query (needs 3.x)"
  else
    sleep 2 # a couple of rule evaluations
    python3 e2e/promql_server.py rules "$URL" "$N_RULES" >> "$TMP/all-exprs.jsonl" \
      || die "Prometheus $VERSION did not load every rule cleanly"
    ok "Prometheus $VERSION loaded all $N_RULES rules of $RULES; they evaluate without error"
    python3 e2e/promql_server.py parse "$URL" "$TMP/all-exprs.jsonl" \
      || die "an expression does not parse with Prometheus $VERSION"
    echo "{\"where\": \"deliberately broken\", \"expr\": $(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$BROKEN")}" > "$TMP/broken-exprs.jsonl"
    if python3 e2e/promql_server.py parse "$URL" "$TMP/broken-exprs.jsonl" >/dev/null 2>&1; then
      die "/api/v1/parse_query accepted a broken expression"
    fi
    ok "a broken expression is refused by Prometheus $VERSION too"
  fi
fi

say "4. metric names"
# Every tidegate metric the dashboard and the alerts use is one the docs' metrics reference
# lists (so a renamed metric cannot leave a dashboard silently empty).
DOC=docs/operations.md
USED=$(grep -oh 'tidegate_\(engine\|operator\|router\)_[a-z][a-z0-9_]*' "${DASHBOARDS[@]}" "$RULES" \
  | sed -E 's/_(bucket|count|sum)$//' | sort -u)
for m in $USED; do
  grep -q "\`$m\`" "$DOC" || die "$m is used by the dashboard or alerts but not in the metrics reference of $DOC"
done
ok "$(echo "$USED" | wc -l) tidegate metrics used, all in the metrics reference of $DOC"

say "promql: all expressions parse"
