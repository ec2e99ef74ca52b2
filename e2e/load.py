#!/usr/bin/env python3
"""Load and probes for the e2e loop, against a local pool: through its router, or straight
at its engines.

With --routers F (the routers file the operator's local runtime writes) every request goes
to the pool's router, its front door; otherwise to the engines of the Prometheus file_sd
targets file. Tenants are identified with the trusted-gateway headers, and each request
carries one of three session ids of its tenant (x-session-id). Standard library only.

The run tallies outcomes by status, error type and kind of tenant (existing or new); a
new_tenant_admission_paused refusal of a tenant the pool had already accepted a request of
(answered, or refused only after it waited in the pool: queue_timeout, engine_failed) is
tallied apart, with `/accepted_before`: the pool promises there are none. Each user sends
one request at a time, so "before" is exact.

  load.py run --targets F [--routers R] --out stats.json --users 40 --base-users 8
              --duration 120 --stop-file F [--errors-out errors.txt]
  load.py probe --targets F [--routers R [--pool P]] --tenant T --tier free
              # prints "STATUS TYPE RETRY_AFTER ENGINE"
  load.py stream --targets F (--index I | --routers R) --tokens N [--started-file F
              [--kill-on-start PIDS]]
              # prints "ok" after [DONE], else the error (or the router's error event)
"""
import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time

MODEL = os.environ.get("E2E_MODEL", "tiny-random")


def targets(path):
    try:
        with open(path) as f:
            groups = json.load(f)
    except (OSError, ValueError):
        return []
    return [t for g in groups for t in g.get("targets", [])]


def router_of(path, pool=None):
    """The host:port of a pool's router from the routers file, or None."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        return None
    for r in rows:
        if pool is None or r.get("pool") == pool:
            return r["url"].split("://", 1)[-1]
    return None


def front(args):
    """Where requests go: the router when --routers is given, else every engine."""
    if getattr(args, "routers", None):
        r = router_of(args.routers, getattr(args, "pool", None))
        return [r] if r else []
    return targets(args.targets)


class EngineGone(Exception):
    """The target refused the connection: the engine already left, nothing was sent."""


def request(target, tenant, tier, max_tokens, stream=False, timeout=60, session=None):
    host, port = target.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.connect()
    except ConnectionRefusedError as e:
        # The targets file lags the pool: a scaled-down engine is still listed for a moment.
        raise EngineGone(target) from e
    body = json.dumps({
        "model": MODEL,
        "prompt": f"{tenant} says hello",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    })
    headers = {
        "content-type": "application/json",
        "x-tidegate-tenant": tenant,
        "x-tidegate-tier": tier,
    }
    if session:
        headers["x-session-id"] = session
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    return conn, conn.getresponse()


# Refusal codes of a request the pool had accepted (it waited in a queue or reached an engine).
ACCEPTED_CODES = {"queue_timeout", "engine_failed"}


def error_of(data):
    """The OpenAI error's (type, code) of an answer's body, "unknown" where absent."""
    try:
        err = json.loads(data)["error"]
        return err.get("type") or "unknown", err.get("code") or "unknown"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "unknown", "unknown"


def tier_of(i):
    return ["enterprise", "standard", "free", "free", "standard", "free"][i % 6]


def run(args):
    stats = {}
    errors = []
    lock = threading.Lock()
    start = time.time()

    def count(key):
        with lock:
            stats[key] = stats.get(key, 0) + 1
            # Lost: the connection broke, or the router answered that the engine failed
            # while it had the request (502; a request already sent is never replayed).
            if key.startswith("error/") or key.startswith("refused/502/"):
                errors.append((time.time(), key))

    def user(i):
        existing = i < args.base_users
        tenant = f"tenant-{i:03d}" if existing else f"newcomer-{i:03d}"
        kind = "existing" if existing else "new"
        accepted = False
        n = 0
        while time.time() - start < args.duration and not os.path.exists(args.stop_file):
            # Existing tenants start at once; newcomers join over the ramp.
            if not existing and time.time() - start < args.ramp_start + (i - args.base_users) * args.ramp_step:
                time.sleep(0.2)
                continue
            ts = front(args)
            if not ts:
                time.sleep(0.5)
                continue
            n += 1
            try:
                conn, resp = request(ts[(i + n) % len(ts)], tenant, tier_of(i), args.tokens,
                                     session=f"{tenant}-{n % 3}")
                data = resp.read()
                conn.close()
                if resp.status == 200:
                    accepted = True
                    count(f"served/{kind}")
                    time.sleep(0.05)
                else:
                    typ, code = error_of(data)
                    paused_after = typ == "new_tenant_admission_paused" and accepted
                    count(f"refused/{resp.status}/{typ}/{kind}" + ("/accepted_before" if paused_after else ""))
                    accepted = accepted or code in ACCEPTED_CODES or resp.status == 502
                    time.sleep(min(float(resp.getheader("retry-after") or 1), 2))
            except EngineGone:
                # Nothing was sent, so nothing was lost: try the next engine at once.
                count(f"rerouted/engine_gone/{kind}")
            except (OSError, http.client.HTTPException) as e:
                count(f"error/{type(e).__name__}/{kind}")
                time.sleep(0.5)

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(args.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    if args.errors_out:
        # When each request was lost (Unix seconds), to tell a deliberate kill from a bug.
        with open(args.errors_out, "w") as f:
            for at, key in sorted(errors):
                f.write(f"{at:.3f} {key}\n")


def probe(args):
    ts = front(args)
    if not ts:
        print("000 no-targets - -")
        return
    conn, resp = request(ts[0], args.tenant, args.tier, 4, timeout=args.timeout)
    data = resp.read()
    typ = "-"
    if resp.status != 200:
        try:
            typ = json.loads(data)["error"]["type"]
        except (ValueError, KeyError, TypeError):
            typ = "unknown"
    print(resp.status, typ, resp.getheader("retry-after") or "-", resp.getheader("x-tidegate-engine") or "-")


def kill_now(pid):
    """SIGKILL pid at once: the pid, or "-" when there is none or it is already gone."""
    try:
        os.kill(int(pid), signal.SIGKILL)
        return pid
    except (TypeError, ValueError, OSError):
        return "-"


def stream(args):
    ts = front(args) if args.routers else targets(args.targets)[args.index:]
    if not ts:
        print("no such target")
        sys.exit(1)
    # "engine pid ..." a line, read before the request: the kill at the first token is instant.
    pids = {}
    if args.kill_on_start:
        with open(args.kill_on_start) as f:
            pids = {w[0]: w[1] for w in map(str.split, f) if len(w) >= 2}
    try:
        conn, resp = request(ts[0], args.tenant, "enterprise", args.tokens, stream=True, timeout=120)
        if resp.status != 200:
            print(f"HTTP {resp.status}")
            sys.exit(1)
        done = False
        started = False
        broken = None
        for line in resp:
            if not started and line.startswith(b"data: {") and args.started_file:
                # The stream is in flight: whoever kills its engine waits for this. It holds
                # the engine that answers (the router's x-tidegate-engine), when known; with
                # --kill-on-start, also the pid of that engine killed here at once (a short
                # stream can end before a poller of this file could kill it) and when.
                started = True
                note = resp.getheader("x-tidegate-engine") or "-"
                if args.kill_on_start:
                    at = time.time()
                    note = f"{note} {kill_now(pids.get(note))} {at:.6f}"
                # Written whole, then renamed: a poller never reads it half-written.
                with open(args.started_file + ".tmp", "w") as f:
                    f.write(note)
                os.replace(args.started_file + ".tmp", args.started_file)
            if line.startswith(b'data: {"error"'):
                broken = json.loads(line[len(b"data: "):])["error"]
            if line.strip() == b"data: [DONE]":
                done = True
        if broken:
            print(f"error event {broken.get('code')}: {broken.get('message')}")
        else:
            print("ok" if done else "stream ended without [DONE]")
        sys.exit(0 if done and not broken else 1)
    except (EngineGone, OSError, http.client.HTTPException) as e:
        print(f"error {type(e).__name__}: {e}")
        sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--targets", required=True)
    r.add_argument("--routers", help="routers file: send every request to the pool's router")
    r.add_argument("--out", required=True)
    r.add_argument("--errors-out", help="file for the time and kind of each lost request")
    r.add_argument("--users", type=int, default=40)
    r.add_argument("--base-users", type=int, default=8)
    r.add_argument("--tokens", type=int, default=24)
    r.add_argument("--duration", type=float, default=120)
    r.add_argument("--ramp-start", type=float, default=8)
    r.add_argument("--ramp-step", type=float, default=0.3)
    r.add_argument("--stop-file", default="/nonexistent")
    q = sub.add_parser("probe")
    q.add_argument("--targets", required=True)
    q.add_argument("--routers", help="routers file: probe through the pool's router")
    q.add_argument("--pool", help="the pool whose router to probe (default: the first)")
    q.add_argument("--timeout", type=float, default=60)
    q.add_argument("--tenant", required=True)
    q.add_argument("--tier", required=True)
    s = sub.add_parser("stream")
    s.add_argument("--targets", required=True)
    s.add_argument("--index", type=int, default=0)
    s.add_argument("--routers", help="routers file: stream through the pool's router")
    s.add_argument("--pool", help="the pool whose router to use (default: the first)")
    s.add_argument("--started-file", help="created when the first token arrives")
    s.add_argument("--kill-on-start", metavar="PIDS",
                   help='file of "engine pid" lines: SIGKILL the answering engine at the first token '
                        '(engine "-": a stream straight at an engine, without the router header)')
    s.add_argument("--tokens", type=int, default=200)
    s.add_argument("--tenant", default="tenant-000")
    args = p.parse_args()
    {"run": run, "probe": probe, "stream": stream}[args.cmd](args)


if __name__ == "__main__":
    main()
