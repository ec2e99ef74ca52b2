#!/usr/bin/env python3
"""Pull every PromQL expression out of a Grafana dashboard (standard library only).

  promql_extract.py DASHBOARD.json OUT_RULES OUT_EXPRS

Writes OUT_RULES, a Prometheus rule file (JSON, which is YAML) with one recording rule per
expression, for `promtool check rules`, and OUT_EXPRS, one JSON object per line
{"where": ..., "expr": ...}, for a Prometheus server's /api/v1/parse_query.

Grafana variables are replaced by values of the same PromQL type first: $__rate_interval,
$__interval and $__range by durations; any other $var / ${var} / ${var:fmt} (the dashboard's
namespace and pool selectors, used inside label-matcher strings) by `.*`. label_values(Q, l)
template queries contribute Q.

Also checks the dashboard's shape: unique panel ids, a datasource and unique refIds on every
query, panels inside the 24-column grid. Exits 1 on a problem.
"""

import json
import re
import sys

DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600"}
VAR = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\$([A-Za-z0-9_]+)")


def substitute(expr: str) -> str:
    return VAR.sub(lambda m: DURATIONS.get(m.group(1) or m.group(2), ".*"), expr)


def main() -> int:
    dash_path, out_rules, out_exprs = sys.argv[1:4]
    dash = json.load(open(dash_path))
    problems, found = [], []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    ids = set()
    for p in panels(dash.get("panels", [])):
        title = p.get("title", "?")
        if p.get("id") in ids:
            problems.append(f"panel {title!r}: duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if g.get("x", 0) + g.get("w", 0) > 24:
            problems.append(f"panel {title!r}: outside the 24-column grid")
        if p.get("type") == "row":
            continue
        if not p.get("datasource"):
            problems.append(f"panel {title!r}: no datasource")
        refs = [t.get("refId") for t in p.get("targets", [])]
        if len(refs) != len(set(refs)) or None in refs:
            problems.append(f"panel {title!r}: refIds must be set and unique: {refs}")
        if not p.get("targets"):
            problems.append(f"panel {title!r}: no queries")
        for t in p.get("targets", []):
            if not t.get("expr"):
                problems.append(f"panel {title!r} query {t.get('refId')}: empty expr")
                continue
            found.append((f"panel {title!r} query {t.get('refId')}", t["expr"]))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            found.append((f"annotation {a.get('name')!r}", a["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", q)
            if m:
                found.append((f"variable ${v.get('name')}", m.group(1)))
            elif q.strip():
                found.append((f"variable ${v.get('name')}", q))

    rules = [{"record": f"dashboard:expr_{i}", "expr": substitute(e)} for i, (_, e) in enumerate(found)]
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(out_rules, "w"), indent=1)
    with open(out_exprs, "w") as f:
        for where, e in found:
            f.write(json.dumps({"where": where, "expr": substitute(e)}) + "\n")
    for p in problems:
        print(f"FAIL: {dash_path}: {p}", file=sys.stderr)
    print(f"  {dash_path}: {len(ids)} panels, {len(found)} PromQL expressions")
    return 1 if problems or not found else 0


if __name__ == "__main__":
    sys.exit(main())
