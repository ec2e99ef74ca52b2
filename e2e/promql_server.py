#!/usr/bin/env python3
"""Helpers for e2e/promql.sh that talk to a throwaway Prometheus (standard library only).

  promql_server.py rules URL WANT      every loaded rule is healthy and there are WANT of
                                       them; prints them as {"where", "expr"} JSON lines
  promql_server.py parse URL EXPRS     every {"where", "expr"} line of EXPRS parses with
                                       /api/v1/parse_query
"""

import json
import sys
import urllib.error
import urllib.parse
import urllib.request


def rules(url: str, want: str) -> int:
    groups = json.load(urllib.request.urlopen(url + "/api/v1/rules", timeout=10))["data"]["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    bad = [f"{r['name']}: {r.get('lastError', '')}" for r in loaded if r.get("health") not in ("ok", "unknown")]
    if len(loaded) != int(want) or bad:
        print(f"FAIL: loaded {len(loaded)} of {want} rules; errors: {bad}", file=sys.stderr)
        return 1
    for r in loaded:
        print(json.dumps({"where": f"rule {r['name']}", "expr": r["query"]}))
    return 0


def parse(url: str, path: str) -> int:
    items = [json.loads(line) for line in open(path) if line.strip()]
    bad = 0
    for it in items:
        body = urllib.parse.urlencode({"query": it["expr"]}).encode()
        try:
            urllib.request.urlopen(url + "/api/v1/parse_query", body, timeout=10).read()
        except urllib.error.HTTPError as e:
            bad += 1
            err = json.loads(e.read() or b"{}").get("error")
            print(f"FAIL: {it['where']}: {err}\n      {it['expr']}", file=sys.stderr)
    print(f"   ok: {len(items) - bad}/{len(items)} expressions parse with /api/v1/parse_query")
    return 1 if bad or not items else 0


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    sys.exit({"rules": rules, "parse": parse}[cmd](*args))
