#!/usr/bin/env python3
"""Seconds from a fault until the slowest router of a pool took an engine out.

Reads `kubectl logs --timestamps --prefix` of the pool's routers on stdin. A router took the
engine POD out at its first line after SINCE (Unix seconds) that says the engine's health left
Ready ("engine health changed" naming POD) or, with `deleted`, that the operator's push took
it out of the router's engine set ("engine set changed" naming POD: removed, or draining). Prints the seconds for the slowest of ROUTERS routers, or "-" while one has not yet.

  router_reaction.py POD SINCE ROUTERS [deleted]
"""
import datetime
import sys


def unix(ts):
    """kubectl's RFC 3339 capture time (nanoseconds, trailing zeros trimmed) as Unix seconds."""
    ts = ts.rstrip("Z")
    whole, _, frac = ts.partition(".")
    t = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def took_out(text, pod, deleted):
    if deleted and "engine set changed" in text and pod in text.split("removed", 1)[-1]:
        return True
    if "engine health changed" not in text or pod not in text:
        return False
    return '"to":"Ready"' not in text and "to=Ready" not in text


def main():
    pod, since, routers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    deleted = sys.argv[4:] == ["deleted"]
    first = {}
    for line in sys.stdin:
        parts = line.split(" ", 2)
        if len(parts) < 3:
            continue
        prefix, ts, text = parts
        try:
            at = unix(ts)
        except ValueError:
            continue
        if at >= since and took_out(text, pod, deleted):
            first.setdefault(prefix, at)
    print(f"{max(first.values()) - since:.2f}" if len(first) >= routers else "-")


if __name__ == "__main__":
    main()
