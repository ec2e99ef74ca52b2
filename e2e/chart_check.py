#!/usr/bin/env python3
"""Checks on the rendered tidegate chart that a schema validator cannot make.

Usage:
  chart_check.py split RENDERED OUT_CORE OUT_RULES
      Write every object except the prometheus-operator kinds (monitoring.coreos.com) to
      OUT_CORE (for the Kubernetes schema validator), check those kinds structurally, and
      write the PrometheusRule groups as a plain Prometheus rule file to OUT_RULES (empty
      groups when there is none).
  chart_check.py invariants RENDERED MODE
      Security and RBAC invariants of the operator objects. MODE: cluster (watches every
      namespace) or namespaced.
  chart_check.py schema SCHEMA VALUES...
      Validate the merged values files (later wins, like helm) against values.schema.json.
  chart_check.py crds RENDERED CRD_DIR
      The CRDs printed by the render are exactly the files in CRD_DIR.

Exits 1 with a message per problem.
"""

import json
import pathlib
import sys

import yaml

MONITORING = "monitoring.coreos.com/"
problems: list[str] = []


def fail(msg: str) -> None:
    problems.append(msg)


def load(path: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d:
            fail(f"{path}: a rendered document is not a Kubernetes object: {str(d)[:120]}")
    return docs


def name(o: dict) -> str:
    return f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def split(rendered: str, out_core: str, out_rules: str) -> None:
    docs = load(rendered)
    core = [d for d in docs if not str(d.get("apiVersion", "")).startswith(MONITORING)]
    mon = [d for d in docs if str(d.get("apiVersion", "")).startswith(MONITORING)]
    pathlib.Path(out_core).write_text(yaml.safe_dump_all(core, sort_keys=False))
    services = by_kind(docs, "Service")
    deployments = by_kind(docs, "Deployment")
    groups: list = []
    for m in mon:
        kind = m["kind"]
        spec = m.get("spec") or {}
        if not m.get("metadata", {}).get("name") or not m["metadata"].get("namespace"):
            fail(f"{name(m)}: needs metadata.name and metadata.namespace")
        if kind == "ServiceMonitor":
            sel = spec.get("selector", {}).get("matchLabels") or {}
            targets = [s for s in services if labels_match(sel, s["metadata"].get("labels", {}))]
            if len(targets) != 1:
                fail(f"{name(m)}: selector {sel} matches {len(targets)} Services, want 1")
                continue
            ports = {p.get("name") for p in targets[0]["spec"].get("ports", [])}
            for ep in spec.get("endpoints", []):
                if ep.get("port") not in ports:
                    fail(f"{name(m)}: endpoint port {ep.get('port')!r} not in Service ports {ports}")
            ns = spec.get("namespaceSelector", {}).get("matchNames", [])
            if targets[0]["metadata"]["namespace"] not in ns:
                fail(f"{name(m)}: namespaceSelector {ns} misses the Service's namespace")
            print(f"  {name(m)}: selects {name(targets[0])}, port(s) "
                  f"{[ep.get('port') for ep in spec.get('endpoints', [])]}")
        elif kind == "PodMonitor":
            if not (spec.get("selector", {}).get("matchLabels")):
                fail(f"{name(m)}: empty selector would scrape every pod")
            eps = spec.get("podMetricsEndpoints") or []
            if not eps:
                fail(f"{name(m)}: no podMetricsEndpoints")
            for ep in eps:
                if not any(r.get("targetLabel") == "pool" for r in ep.get("relabelings", [])):
                    fail(f"{name(m)}: no relabeling to the `pool` label the dashboard uses")
            print(f"  {name(m)}: selects pods {spec.get('selector', {}).get('matchLabels')}")
        elif kind == "PrometheusRule":
            g = spec.get("groups") or []
            if not g:
                fail(f"{name(m)}: no rule groups")
            groups.extend(g)
            print(f"  {name(m)}: {sum(len(x.get('rules', [])) for x in g)} rules "
                  f"in {len(g)} groups (checked with promtool below)")
        else:
            fail(f"{name(m)}: unexpected kind {kind}")
    pathlib.Path(out_rules).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    print(f"  {len(core)} objects for the schema validator, {len(mon)} prometheus-operator objects checked here")
    if not deployments:
        fail("no Deployment rendered")


def invariants(rendered: str, mode: str) -> None:
    docs = load(rendered)
    deps = by_kind(docs, "Deployment")
    if len(deps) != 1:
        fail(f"want exactly one Deployment, got {len(deps)}")
        return
    dep = deps[0]
    pod = dep["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True:
        fail("pod securityContext.runAsNonRoot must be true")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        fail("pod seccompProfile must be RuntimeDefault")
    (c,) = [c for c in pod["containers"] if c["name"] == "operator"]
    sc = c.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False:
        fail("container allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        fail("container readOnlyRootFilesystem must be true")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        fail("container must drop ALL capabilities")
    if sc.get("privileged"):
        fail("container must not be privileged")
    if not c.get("resources", {}).get("requests"):
        fail("container needs resource requests")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if "metrics" not in ports:
        fail("container needs a port named metrics")
    for probe in ("livenessProbe", "readinessProbe"):
        hg = c.get(probe, {}).get("httpGet", {})
        if hg.get("path") != "/healthz" or hg.get("port") not in ("metrics", ports.get("metrics")):
            fail(f"{probe} must GET /healthz on the metrics port, got {hg}")
    args = c.get("args", [])
    if not args or args[0] != "run":
        fail(f"args must start with the run subcommand: {args}")
    if f"--metrics-listen=0.0.0.0:{ports.get('metrics')}" not in args:
        fail(f"--metrics-listen must match the metrics port {ports.get('metrics')}: {args}")
    if not any(a.startswith("--prometheus-url=") for a in args):
        fail("--prometheus-url missing")
    replicas = dep["spec"].get("replicas", 1)
    if replicas > 1 and "--leader-election" not in args:
        fail("more than one replica without --leader-election")
    sa = pod.get("serviceAccountName")
    if not any(s["metadata"]["name"] == sa for s in by_kind(docs, "ServiceAccount")):
        fail(f"ServiceAccount {sa} is not rendered")

    # RBAC: no wildcards, nothing outside the expected API groups, and in namespaced mode
    # nothing cluster-wide is bound to the operator.
    allowed_groups = {"tidegate.dev", "apps", "", "policy", "events.k8s.io", "coordination.k8s.io"}
    for role in by_kind(docs, "Role") + by_kind(docs, "ClusterRole"):
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                if "*" in rule.get(field, []):
                    fail(f"{name(role)}: wildcard in {field}")
            for g in rule.get("apiGroups", []):
                if g not in allowed_groups:
                    fail(f"{name(role)}: unexpected API group {g!r}")
            if "escalate" in rule.get("verbs", []) or "bind" in rule.get("verbs", []) or "impersonate" in rule.get("verbs", []):
                fail(f"{name(role)}: escalate/bind/impersonate verbs")
    bound_cluster = [b for b in by_kind(docs, "ClusterRoleBinding")
                     if any(s.get("name") == sa for s in b.get("subjects", []))]
    if mode == "namespaced" and bound_cluster:
        fail(f"namespaced mode binds ClusterRoles to the operator: {[name(b) for b in bound_cluster]}")
    if mode == "cluster" and len(bound_cluster) != 1:
        fail(f"cluster mode wants one ClusterRoleBinding for the operator, got {len(bound_cluster)}")
    for b in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        ref = b["roleRef"]
        if not any(r["metadata"]["name"] == ref["name"] for r in by_kind(docs, ref["kind"])):
            fail(f"{name(b)}: refers to {ref['kind']}/{ref['name']} that is not rendered")
        ns = b["metadata"].get("namespace")
        if ref["kind"] == "Role" and not any(
            r["metadata"]["name"] == ref["name"] and r["metadata"].get("namespace") == ns
            for r in by_kind(docs, "Role")
        ):
            fail(f"{name(b)}: Role {ref['name']} is not in namespace {ns}")
    lease_roles = [r for r in by_kind(docs, "Role")
                   if any("leases" in rule.get("resources", []) for rule in r.get("rules", []))]
    if "--leader-election" in args:
        if not lease_roles:
            fail("leader election is on but no Role grants leases")
        for r in lease_roles:
            if r["metadata"].get("namespace") != dep["metadata"]["namespace"]:
                fail(f"{name(r)}: lease Role must be in the operator's namespace")
    verbs = {}
    for r in by_kind(docs, "Role") + by_kind(docs, "ClusterRole"):
        if r["metadata"]["name"].endswith(("-view", "-edit")):
            continue
        for rule in r.get("rules", []):
            for g in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    verbs.setdefault((g, res), set()).update(rule.get("verbs", []))
    # Exactly what the operator calls (operator/RBAC.md); the cluster e2e asks the real API
    # server the same with kubectl auth can-i (e2e/cluster/rbac-matrix.txt).
    need = {
        ("tidegate.dev", "inferencepools"): {"get", "list", "watch"},
        ("tidegate.dev", "inferencepools/status"): {"patch"},
        ("tidegate.dev", "tierpolicies"): {"get", "list", "watch"},
        ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
        ("", "services"): {"get", "list", "watch", "create", "patch"},
        ("", "secrets"): {"get", "create"},
        ("", "configmaps"): {"get", "create", "patch", "delete"},
        ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch"},
        ("", "pods"): {"list", "watch", "patch"},
        ("events.k8s.io", "events"): {"create", "patch"},
    }
    if "--leader-election" in args:
        need[("coordination.k8s.io", "leases")] = {"get", "create", "update"}
    for key in sorted(set(need) | set(verbs)):
        want, got = need.get(key, set()), verbs.get(key, set())
        if want - got:
            fail(f"RBAC lacks {sorted(want - got)} on {key[0] or 'core'}/{key[1]}")
        if got - want:
            fail(f"RBAC grants more than the operator uses on {key[0] or 'core'}/{key[1]}: {sorted(got - want)}")
    print(f"  {name(dep)}: {replicas} replica(s), restricted securityContext, probes on /healthz, "
          f"args {args}")
    print(f"  RBAC ({mode}): {len(by_kind(docs, 'ClusterRole'))} ClusterRole(s), "
          f"{len(by_kind(docs, 'Role'))} Role(s), no wildcards, exactly the verbs the operator uses")
    network_policy(docs)


# What the operator reaches over the pod network, from its object contract
# (operator/src/k8s/mod.rs): the admin API of the engine and of the router pods.
ADMIN_PEERS = {
    "engines": ({"app.kubernetes.io/name": "tidegate-engine"}, 8001),
    "routers": ({"app.kubernetes.io/name": "tidegate-router"}, 8001),
}


def network_policy(docs: list[dict]) -> None:
    for np in by_kind(docs, "NetworkPolicy"):
        egress = np["spec"].get("egress", [])
        ok = True
        for what, (labels, port) in ADMIN_PEERS.items():
            allowed = any(
                any(p.get("port") == port for p in rule.get("ports", []))
                and any(labels_match(peer.get("podSelector", {}).get("matchLabels") or {}, labels)
                        for peer in rule.get("to", []))
                for rule in egress)
            if not allowed:
                ok = False
                fail(f"{name(np)}: no egress to the {what}' admin API ({labels}, port {port})")
        if ok:
            print(f"  {name(np)}: egress reaches the admin API of engines and routers (port 8001)")


def deep_merge(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = deep_merge(a.get(k), v) if k in a else v
        return out
    return b


def schema(schema_path: str, values_paths: list[str]) -> None:
    import jsonschema

    s = json.loads(pathlib.Path(schema_path).read_text())
    jsonschema.Draft7Validator.check_schema(s)
    merged: dict = {}
    for p in values_paths:
        merged = deep_merge(merged, yaml.safe_load(pathlib.Path(p).read_text()) or {})
    errors = sorted(jsonschema.Draft7Validator(s).iter_errors(merged), key=lambda e: list(e.path))
    for e in errors:
        fail(f"values {'+'.join(values_paths)}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
    if not errors:
        print(f"  {' + '.join(values_paths)}: valid against {schema_path}")


def crds(rendered: str, crd_dir: str) -> None:
    docs = [d for d in load(rendered) if d.get("kind") == "CustomResourceDefinition"]
    files = {}
    for f in sorted(pathlib.Path(crd_dir).glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d:
                files[d["metadata"]["name"]] = d
    got = {d["metadata"]["name"]: d for d in docs}
    if set(got) != set(files):
        fail(f"rendered CRDs {sorted(got)} != {crd_dir} {sorted(files)}")
    for n, d in got.items():
        if n in files and d != files[n]:
            fail(f"rendered CRD {n} differs from {crd_dir}")
    print(f"  the render prints the CRDs {sorted(got)} unchanged")


def main() -> int:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "split":
        split(*args)
    elif cmd == "invariants":
        invariants(*args)
    elif cmd == "schema":
        schema(args[0], args[1:])
    elif cmd == "crds":
        crds(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
