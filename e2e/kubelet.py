#!/usr/bin/env python3
"""Runs the engine and router containers of a rendered pool the way a kubelet would, as local processes.

Input: the YAML `tidegate-operator render` printed (Secret, the engine and router Deployments,
their Services and PDBs). From each Deployment's pod template it takes the container's
command/args/env as written:
`valueFrom.secretKeyRef` is resolved from the rendered Secret; each volume mount is mapped to a
temporary folder (a mount path in an argument or variable is rewritten to that folder; a
`--volume NAME=DIR` option fills a volume, e.g. a PVC's contents). The image's entrypoint is
replaced by the engine binary. Then, as the kubelet does:

1. the engine's startup probe is polled at its period until it succeeds (failing after
   failureThreshold tries), then readiness and liveness probes, with their paths, named ports,
   timeouts and thresholds as declared;
2. a chat completion goes to the engine container port its Service's `http` port targets;
3. the router container (the same binary, its second role) starts in its own "pod", its
   probes are polled the same way, its admin API refuses a push without the token and takes
   the engine (named by its pod name, at its pod address) with it, as the operator pushes;
   then a chat completion goes to the router container port the front-door Service's `http`
   port targets and must be answered by the engine, named in `x-tidegate-engine`; the router
   then stops as a kubelet stops it (preStop, SIGTERM, exit 0 within its grace period);
4. the engine: a streaming chat completion is left in flight; on termination the preStop
   hook (sleep) runs, then SIGTERM; the container must exit 0 within
   terminationGracePeriodSeconds (counted from the preStop start, as the kubelet does) and
   the in-flight stream must finish.

Each pod gets its own loopback address (POD_IPS), standing in for its network namespace: a
bind on all addresses (`0.0.0.0`) in a container's args or env is rewritten to its pod's
address, so the engine and the router both listen on their contract ports (8000/8001), as
they do in their pods.

Prints one line per check and `N passed, M failed`; exits non-zero on any failure.
What it does not emulate: the image's filesystem, uid/gid and read-only root (the processes
run as the caller), network isolation (a pod address is reachable from everything here).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

PASSED = 0
FAILED = 0

# Loopback addresses standing in for the pods' own (Linux routes all of 127/8 to lo).
POD_IPS = {"engine": "127.0.0.2", "router": "127.0.0.3"}


def check(name, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print(f"  ok   {name}")
    else:
        FAILED += 1
        print(f"  FAIL {name}")
        if detail:
            print("       " + str(detail).replace("\n", "\n       "))
    return ok


def load(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    return by_kind


def resolve_env(container, secrets):
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            raise SystemExit(f"env {var['name']}: only value and secretKeyRef are emulated")
        secret = secrets.get(ref["name"])
        if secret is None:
            raise SystemExit(f"env {var['name']}: Secret {ref['name']} was not rendered")
        data = secret.get("stringData", {})
        if ref["key"] not in data:
            raise SystemExit(f"env {var['name']}: Secret {ref['name']} has no key {ref['key']}")
        env[var["name"]] = data[ref["key"]]
    return env


def map_mounts(container, pod_spec, given, root):
    """mountPath → local folder, for every volume mount of the container."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    mapping = {}
    for m in container.get("volumeMounts", []):
        name = m["name"]
        if name not in volumes:
            raise SystemExit(f"volumeMount {name}: no such volume in the pod")
        folder = given.get(name) or tempfile.mkdtemp(prefix=f"vol-{name}-", dir=root)
        mapping[m["mountPath"]] = folder
    return mapping


def rewrite(value, mapping, pod_ip):
    """A container's arg or env value as its process here sees it: mount paths mapped to
    folders, a bind on all addresses (`0.0.0.0:PORT`, as `--flag=` too) to its pod's address."""
    value = value.replace("0.0.0.0:", f"{pod_ip}:") if "0.0.0.0:" in value else value
    if value == "0.0.0.0":
        return pod_ip
    for mount in sorted(mapping, key=len, reverse=True):
        if value == mount or value.startswith(mount + "/"):
            return mapping[mount] + value[len(mount):]
        if "=" in value:  # --flag=/mount/path
            k, v = value.split("=", 1)
            if v == mount or v.startswith(mount + "/"):
                return f"{k}={mapping[mount]}{v[len(mount):]}"
    return value


def named_port(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise SystemExit(f"port {port!r} is not a named port of the container")


def probe_once(container, probe, host):
    get = probe["httpGet"]
    port = named_port(container, get["port"])
    url = f"http://{host}:{port}{get.get('path', '/')}"
    try:
        with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError):
        return False


def run_probe(pod, kind):
    """Polls a probe as declared; returns (succeeded, tries, seconds)."""
    container, proc = pod.container, pod.proc
    probe = container.get(kind)
    if not probe:
        return True, 0, 0.0
    period = probe.get("periodSeconds", 10)
    failures = probe.get("failureThreshold", 3)
    t0 = time.monotonic()
    time.sleep(probe.get("initialDelaySeconds", 0))
    for tries in range(1, failures + 1):
        if proc.poll() is not None:
            return False, tries, time.monotonic() - t0
        started = time.monotonic()
        if probe_once(container, probe, pod.ip):
            return True, tries, time.monotonic() - t0
        time.sleep(max(0.0, period - (time.monotonic() - started)))
    return False, failures, time.monotonic() - t0


def chat(host, port, model, max_tokens, stream=False, timeout=60):
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello to the cluster."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }).encode()
    req = urllib.request.Request(
        f"http://{host}:{port}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=timeout)


def selects(service, template):
    labels = template["metadata"].get("labels", {})
    sel = service["spec"].get("selector") or {}
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def service_target(services, template, container):
    """The container port the `http` port of the Service selecting these pods targets."""
    matching = [svc for svc in services if selects(svc, template)]
    if len(matching) != 1:
        raise SystemExit(f"{len(matching)} Services select the {container['name']} pods")
    http = next(p for p in matching[0]["spec"]["ports"] if p["name"] == "http")
    return matching[0]["metadata"]["name"], named_port(container, http.get("targetPort", http["port"]))


def deployment_with(objs, container_name):
    """The Deployment whose pod runs a container of this name, and that container."""
    for d in objs.get("Deployment", []):
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["name"] == container_name:
                return d, c
    return None, None


class Pod:
    """One container of a rendered Deployment, running here as a process."""

    def __init__(self, role, deployment, container, secrets, given, binary, log_path):
        self.role = role
        self.ip = POD_IPS[role]
        self.deployment = deployment
        self.template = deployment["spec"]["template"]
        self.pod_spec = self.template["spec"]
        self.container = container
        self.name = deployment["metadata"]["name"] + "-0"
        self.root = tempfile.mkdtemp(prefix=f"kubelet-{role}-")
        mounts = map_mounts(container, self.pod_spec, given, self.root)
        self.argv = [binary] + container.get("command", [])[1:] + [
            rewrite(a, mounts, self.ip) for a in container.get("args", [])]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.root,
                    "HOSTNAME": self.name}
        self.env.update({k: rewrite(v, mounts, self.ip)
                         for k, v in resolve_env(container, secrets).items()})
        print(f"== {role} container: {' '.join(self.argv)}")
        print(f"   env: {sorted(self.env)}; mounts: {mounts}; pod address {self.ip}")
        self.log_path = log_path or os.path.join(self.root, f"{role}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def tail(self):
        return "".join(open(self.log_path).readlines()[-15:])

    def port(self, name):
        return named_port(self.container, name)

    def start_probes(self):
        """Startup, readiness and liveness as the kubelet runs them; False on a failure."""
        for kind in ("startupProbe", "readinessProbe"):
            if kind not in self.container:
                continue
            ok, tries, secs = run_probe(self, kind)
            if not check(f"{self.role}: {kind} succeeds ({tries} tries, {secs:.1f}s)", ok,
                         self.tail()):
                return False
        return check(f"{self.role}: liveness probe succeeds",
                     probe_once(self.container, self.container["livenessProbe"], self.ip),
                     self.tail())

    def terminate(self):
        """preStop (sleep), then SIGTERM; returns (exit code or None, seconds, grace)."""
        grace = self.pod_spec.get("terminationGracePeriodSeconds", 30)
        pre = self.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get(
            "seconds", 0)
        t0 = time.monotonic()
        time.sleep(pre)
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=max(1, grace - pre))
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - t0, grace, pre

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rendered", help="YAML printed by tidegate-operator render")
    ap.add_argument("--engine-bin", required=True, help="replaces the image's entrypoint")
    ap.add_argument("--volume", action="append", default=[], metavar="NAME=DIR",
                    help="fill a volume with a folder (e.g. the model PVC)")
    ap.add_argument("--log", default=None, help="engine container log file")
    ap.add_argument("--router-log", default=None, help="router container log file")
    args = ap.parse_args()

    objs = load(args.rendered)
    secrets = {s["metadata"]["name"]: s for s in objs.get("Secret", [])}
    engine_dep, engine_c = deployment_with(objs, "engine")
    router_dep, router_c = deployment_with(objs, "router")
    if engine_dep is None:
        raise SystemExit("no Deployment with an `engine` container was rendered")
    if not check("a router Deployment is rendered", router_dep is not None):
        return 1
    given = dict(v.split("=", 1) for v in args.volume)
    engine = Pod("engine", engine_dep, engine_c, secrets, given, args.engine_bin, args.log)
    router = None
    try:
        model = next(a for i, a in enumerate(engine_c["args"])
                     if engine_c["args"][i - 1] == "--served-model-name")
        if not engine.start_probes():
            return 1
        svc, port = service_target(objs["Service"], engine.template, engine.container)
        try:
            with chat(engine.ip, port, model, 8) as r:
                answer = json.load(r)
            check(f"engine: chat completion on the port Service {svc} targets ({port})",
                  answer["choices"][0]["message"]["content"] is not None, answer)
        except (urllib.error.URLError, OSError, KeyError) as e:
            check(f"engine: chat completion on the port Service {svc} targets ({port})", False,
                  f"{e}\n{engine.tail()}")
        router = Pod("router", router_dep, router_c, secrets, {}, args.engine_bin,
                     args.router_log)
        router_checks(router, engine, objs, model)
        router.close()
        router = None
        engine_stop(engine, model)
        return 0
    finally:
        if router is not None:
            router.close()
        engine.close()


def push_endpoints(router, endpoints, token):
    body = json.dumps({"endpoints": endpoints}).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"http://{router.ip}:{router.port('admin')}/admin/v1/endpoints", data=body,
        headers=headers, method="PUT")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None


def router_checks(router, engine, objs, model):
    if not router.start_probes():
        return
    status, _ = push_endpoints(router, [], None)
    check(f"router: its admin API refuses an endpoint push without the token ({status})",
          status == 401)
    # As the operator pushes: the engine pod by name, at its address and API port.
    engine_url = f"http://{engine.ip}:{engine.port('http')}"
    status, view = push_endpoints(
        router, [{"name": engine.name, "url": engine_url}], router.env.get("TIDEGATE_ADMIN_TOKEN"))
    check(f"router: takes the engine set with the admin token from the pool's Secret ({status})",
          status == 200 and view is not None and len(view["endpoints"]) == 1, view)
    svc, port = service_target(objs["Service"], router.template, router.container)
    name = f"router: chat completion on the port front-door Service {svc} targets ({port})"
    try:
        with chat(router.ip, port, model, 8) as r:
            served_by = r.headers.get("x-tidegate-engine")
            answer = json.load(r)
        check(name, answer["choices"][0]["message"]["content"] is not None, answer)
        check(f"router: the answer names the engine that served it (x-tidegate-engine: {served_by})",
              served_by == engine.name, f"expected {engine.name}")
    except (urllib.error.URLError, OSError, KeyError) as e:
        check(name, False, f"{e}\n{router.tail()}")
    code, took, grace, pre = router.terminate()
    check(f"router: SIGTERM after the {pre}s preStop: exits 0 within terminationGracePeriodSeconds "
          f"{grace}s (took {took:.1f}s)", code == 0, f"exit {code}\n{router.tail()}")


def engine_stop(engine, model):
    port = engine.port("http")
    streamed = {"done": False, "error": None}
    first = threading.Event()

    def stream():
        try:
            with chat(engine.ip, port, model, 512, stream=True, timeout=120) as r:
                for line in r:
                    first.set()
                    if line.strip() == b"data: [DONE]":
                        streamed["done"] = True
        except (urllib.error.URLError, OSError) as e:
            streamed["error"] = str(e)
        first.set()

    grace = engine.pod_spec.get("terminationGracePeriodSeconds", 30)
    pre = engine.container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get(
        "seconds", 0)
    t0 = time.monotonic()
    time.sleep(pre)
    # A long stream started as the preStop hook ends is in flight at SIGTERM (or just done:
    # either way it must not be cut off).
    t = threading.Thread(target=stream)
    t.start()
    first.wait(30)
    engine.proc.send_signal(signal.SIGTERM)
    try:
        code = engine.proc.wait(timeout=max(1, grace - pre))
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    t.join(30)
    check(f"engine: SIGTERM after the {pre}s preStop: exits 0 within terminationGracePeriodSeconds "
          f"{grace}s (took {took:.1f}s)", code == 0, f"exit {code}\n{engine.tail()}")
    check("engine: the stream in flight at SIGTERM finished ([DONE])", streamed["done"], streamed)


if __name__ == "__main__":
    rc = main()
    print(f"{PASSED} passed, {FAILED} failed")
    sys.exit(1 if (rc or FAILED) else 0)
