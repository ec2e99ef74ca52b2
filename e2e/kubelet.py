#!/usr/bin/env python3
"""Runs the engine container of a rendered pool the way a kubelet would, as a local process.

Input: the YAML `tidegate-operator render` printed (Secret, Service, Deployment, PDB). From the
Deployment's pod template it takes the engine container's command/args/env as written:
`valueFrom.secretKeyRef` is resolved from the rendered Secret; each volume mount is mapped to a
temporary folder (a mount path in an argument or variable is rewritten to that folder; a
`--volume NAME=DIR` option fills a volume, e.g. a PVC's contents). The image's entrypoint is
replaced by the engine binary. Then, as the kubelet does:

1. the startup probe is polled at its period until it succeeds (failing after
   failureThreshold tries), then readiness and liveness probes, with their paths, named ports,
   timeouts and thresholds as declared;
2. a chat completion goes to the container port the Service's `http` port targets, and a
   second, streaming one is left in flight;
3. on termination: the preStop hook (sleep) runs, then SIGTERM; the container must exit 0
   within terminationGracePeriodSeconds (counted from the preStop start, as the kubelet does)
   and the in-flight stream must finish.

Prints one line per check and `N passed, M failed`; exits non-zero on any failure.
What it does not emulate: the image's filesystem, uid/gid and read-only root (the process runs
as the caller), network namespaces (the container ports are bound on this machine).
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


def rewrite(value, mapping):
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


def probe_once(container, probe):
    get = probe["httpGet"]
    port = named_port(container, get["port"])
    url = f"http://127.0.0.1:{port}{get.get('path', '/')}"
    try:
        with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError):
        return False


def run_probe(container, kind, proc):
    """Polls a probe as declared; returns (succeeded, tries, seconds)."""
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
        if probe_once(container, probe):
            return True, tries, time.monotonic() - t0
        time.sleep(max(0.0, period - (time.monotonic() - started)))
    return False, failures, time.monotonic() - t0


def chat(port, model, max_tokens, stream=False, timeout=60):
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello to the cluster."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=timeout)


def service_target(services, container):
    svc = services[0]
    http = next(p for p in svc["spec"]["ports"] if p["name"] == "http")
    return named_port(container, http.get("targetPort", http["port"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rendered", help="YAML printed by tidegate-operator render")
    ap.add_argument("--engine-bin", required=True, help="replaces the image's entrypoint")
    ap.add_argument("--volume", action="append", default=[], metavar="NAME=DIR",
                    help="fill a volume with a folder (e.g. the model PVC)")
    ap.add_argument("--log", default=None, help="container log file")
    args = ap.parse_args()

    objs = load(args.rendered)
    deployment = objs["Deployment"][0]
    pod_spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod_spec["containers"] if c["name"] == "engine")
    secrets = {s["metadata"]["name"]: s for s in objs.get("Secret", [])}
    model = next(a for i, a in enumerate(container["args"])
                 if container["args"][i - 1] == "--served-model-name")

    root = tempfile.mkdtemp(prefix="kubelet-")
    given = dict(v.split("=", 1) for v in args.volume)
    mounts = map_mounts(container, pod_spec, given, root)
    argv = [args.engine_bin] + container.get("command", [])[1:] + [
        rewrite(a, mounts) for a in container.get("args", [])]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root,
           "HOSTNAME": deployment["metadata"]["name"] + "-0"}
    env.update({k: rewrite(v, mounts) for k, v in resolve_env(container, secrets).items()})
    print(f"== container: {' '.join(argv)}")
    print(f"   env: {sorted(env)}; mounts: {mounts}")

    log = open(args.log or os.path.join(root, "engine.log"), "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        return lifecycle(proc, container, pod_spec, objs, model, log.name)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def lifecycle(proc, container, pod_spec, objs, model, log_path):
    def tail():
        return "".join(open(log_path).readlines()[-15:])

    ok, tries, secs = run_probe(container, "startupProbe", proc)
    if not check(f"startup probe succeeds ({tries} tries, {secs:.1f}s)", ok, tail()):
        return 1
    ok, tries, secs = run_probe(container, "readinessProbe", proc)
    if not check(f"readiness probe succeeds ({tries} tries, {secs:.1f}s)", ok, tail()):
        return 1
    check("liveness probe succeeds", probe_once(container, container["livenessProbe"]))

    port = service_target(objs["Service"], container)
    try:
        with chat(port, model, 8) as r:
            answer = json.load(r)
        check(f"chat completion on the Service's target port {port}",
              answer["choices"][0]["message"]["content"] is not None, answer)
    except (urllib.error.URLError, OSError, KeyError) as e:
        check(f"chat completion on the Service's target port {port}", False, f"{e}\n{tail()}")

    streamed = {"done": False, "error": None}
    first = threading.Event()

    def stream():
        try:
            with chat(port, model, 512, stream=True, timeout=120) as r:
                for line in r:
                    first.set()
                    if line.strip() == b"data: [DONE]":
                        streamed["done"] = True
        except (urllib.error.URLError, OSError) as e:
            streamed["error"] = str(e)
        first.set()

    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    pre = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    t0 = time.monotonic()
    time.sleep(pre)
    # A long stream started as the preStop hook ends is in flight at SIGTERM (or just done:
    # either way it must not be cut off).
    t = threading.Thread(target=stream)
    t.start()
    first.wait(30)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=max(1, grace - pre))
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    t.join(30)
    check(f"SIGTERM after the {pre}s preStop: exits 0 within terminationGracePeriodSeconds "
          f"{grace}s (took {took:.1f}s)", code == 0, f"exit {code}\n{tail()}")
    check("the stream in flight at SIGTERM finished ([DONE])", streamed["done"], streamed)
    return 0


if __name__ == "__main__":
    rc = main()
    print(f"{PASSED} passed, {FAILED} failed")
    sys.exit(1 if (rc or FAILED) else 0)
