#!/usr/bin/env python3
"""Helpers of scripts/bench-operator-scale.sh: the objects it applies and the figures it takes.

  nodes N                      simulated nodes (kwok), pod addresses on loopback
  pools ...                    namespaces, tier policies, key Secrets, admin Secrets, pools
  apf-count FLOWSCHEMA         requests the API server dispatched for one flow schema so far
  spec-change ...              patch every pool's spec, time until its Deployment shows it
  converged LOG N SINCE        seconds from SINCE until N pools have a reconcile in LOG
"""
import argparse
import concurrent.futures
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

API = "tidegate.dev/v1alpha1"


def emit(items):
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=1)
    print()


def cmd_nodes(a):
    resources = {"cpu": "256", "memory": "2Ti", "pods": str(a.pods)}
    items = []
    for i in range(a.count):
        name = f"kwok-node-{i}"
        items.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                           "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
            },
            # Pod addresses on loopback: every simulated pod's ports are this machine's.
            "spec": {"podCIDR": f"127.1.{i + 1}.0/24", "podCIDRs": [f"127.1.{i + 1}.0/24"]},
            "status": {"allocatable": resources, "capacity": resources},
        })
    emit(items)


def pool_names(a):
    for j in range(a.pools):
        yield f"scale-{j % a.namespaces}", f"pool-{j}"


def cmd_pools(a):
    items = []
    for n in range(a.namespaces):
        ns = f"scale-{n}"
        items.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        items.append({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": ns},
            "stringData": {"tenants.yaml": "- {tenant: acme, tier: gold, apiKey: bench-gold-key}\n"
                                           "- {tenant: globex, tier: free, apiKey: bench-free-key}\n"},
        })
        items.append({
            "apiVersion": API, "kind": "TierPolicy", "metadata": {"name": "tiers", "namespace": ns},
            "spec": {"tiers": [{"name": "gold", "priority": 10}, {"name": "free"}],
                     "defaultTier": "free", "tenancy": {"apiKeys": {"secretName": "keys"}}},
        })
    for ns, name in pool_names(a):
        # The pool's admin Secret made ahead with the token the shared engine and router
        # check (the operator uses a Secret it finds as it is).
        items.append({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": f"{name}-admin", "namespace": ns},
            "stringData": {"token": a.token},
        })
        items.append({
            "apiVersion": API, "kind": "InferencePool", "metadata": {"name": name, "namespace": ns},
            "spec": {
                "model": {"name": "bench", "uri": "file:///models/bench"},
                "engine": {"image": "tidegate-engine:local",
                           "resources": {"gpus": 0, "memory": "256Mi"}},
                "replicas": {"min": a.replicas, "max": a.replicas + 2},
                "scaling": {"interval": a.interval, "metrics": {"source": "Direct"}},
                "tierPolicyRef": {"name": "tiers"},
            },
        })
    emit(items)


def cmd_apf_count(a):
    text = subprocess.run(["kubectl", "get", "--raw", "/metrics"], check=True,
                          capture_output=True, text=True).stdout
    total = 0.0
    pat = re.compile(r'^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} (\S+)$')
    for line in text.splitlines():
        m = pat.match(line)
        if m and f'flow_schema="{a.flowschema}"' in m.group(1):
            total += float(m.group(2))
    print(int(total))


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def cmd_spec_change(a):
    """Sets every pool's replicas.min to TARGET at once (a burst of patches) and times, per
    pool, from its patch's answer to the first watch event of its engine Deployment with
    spec.replicas == TARGET."""
    base = a.proxy.rstrip("/")
    pools = list(pool_names(a))
    seen, patched = {}, {}
    lock = threading.Lock()
    rv = json.load(urllib.request.urlopen(
        f"{base}/apis/apps/v1/deployments?labelSelector=app.kubernetes.io/managed-by%3Dtidegate-operator&limit=1"
    ))["metadata"]["resourceVersion"]
    ready = threading.Event()

    def watch():
        url = (f"{base}/apis/apps/v1/deployments?watch=1&resourceVersion={rv}"
               "&labelSelector=app.kubernetes.io/managed-by%3Dtidegate-operator")
        with urllib.request.urlopen(url, timeout=a.timeout + 30) as resp:
            ready.set()
            for line in resp:
                ev = json.loads(line)
                obj = ev.get("object", {})
                meta = obj.get("metadata", {})
                key = (meta.get("namespace"), meta.get("name"))
                if obj.get("spec", {}).get("replicas") == a.target:
                    with lock:
                        seen.setdefault(key, time.time())
                        if len(seen) >= len(pools):
                            return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    ready.wait(10)

    def patch(p):
        ns, name = p
        body = json.dumps({"spec": {"replicas": {"min": a.target, "max": a.target + 2}}}).encode()
        req = urllib.request.Request(
            f"{base}/apis/{API}/namespaces/{ns}/inferencepools/{name}", data=body, method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"})
        urllib.request.urlopen(req).read()
        with lock:
            patched[p] = time.time()

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
        list(ex.map(patch, pools))
    burst = time.time() - t0
    t.join(a.timeout)
    lat = [seen[p] - patched[p] for p in pools if p in seen and p in patched]
    missing = len(pools) - len(lat)
    print(json.dumps({
        "pools": len(pools), "applied": len(lat), "missing": missing,
        "patch_burst_s": round(burst, 2),
        "p50_s": round(percentile(lat, 0.5), 3) if lat else None,
        "p99_s": round(percentile(lat, 0.99), 3) if lat else None,
        "max_s": round(max(lat), 3) if lat else None,
    }))


def cmd_converged(a):
    """Waits until LOG (the operator's JSON log) names N distinct pools in 'reconciled'
    lines; prints the seconds since SINCE (a Unix time)."""
    deadline = time.time() + a.timeout
    pools = set()
    with open(a.log) as f:
        while time.time() < deadline:
            line = f.readline()
            if not line:
                time.sleep(0.2)
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("message") == "reconciled" and ev.get("pool"):
                pools.add(ev["pool"])
                if len(pools) >= a.n:
                    print(round(time.time() - a.since, 2))
                    return
    print(f"only {len(pools)} of {a.n} pools reconciled in {a.timeout}s", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("nodes")
    p.add_argument("count", type=int)
    p.add_argument("--pods", type=int, default=250)
    p.set_defaults(f=cmd_nodes)

    def pool_args(p):
        p.add_argument("--pools", type=int, default=100)
        p.add_argument("--namespaces", type=int, default=10)

    p = sub.add_parser("pools")
    pool_args(p)
    p.add_argument("--replicas", type=int, default=10)
    p.add_argument("--interval", default="15s")
    p.add_argument("--token", required=True)
    p.set_defaults(f=cmd_pools)
    p = sub.add_parser("apf-count")
    p.add_argument("flowschema")
    p.set_defaults(f=cmd_apf_count)
    p = sub.add_parser("spec-change")
    pool_args(p)
    p.add_argument("--proxy", required=True, help="kubectl proxy URL")
    p.add_argument("--target", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120)
    p.set_defaults(f=cmd_spec_change)
    p = sub.add_parser("converged")
    p.add_argument("log")
    p.add_argument("n", type=int)
    p.add_argument("since", type=float)
    p.add_argument("--timeout", type=float, default=300)
    p.set_defaults(f=cmd_converged)
    a = ap.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
