#!/usr/bin/env python3
"""What each fault cost the load: the load's lost requests (e2e/load.py --errors-out: "unix-time
kind" a line) put against the faults ("unix-time what", or "start end what" for one that lasts,
a line), a loss counted against a fault when it came within a second before it to five seconds
after it (after its end).

Prints one line per fault ("what: N lost") and, last, "unexplained: N". Exits 1 when a loss
belongs to no engine fault, or when a fault listed in --lossless (a router deleted) lost any.

  losses.py ERRORS FAULTS [--lossless WHAT]...
"""
import argparse
import sys


def rows(path):
    with open(path) as f:
        return [(float(at), what) for at, what in (line.split(None, 1) for line in f if line.strip())]


def windows(path):
    """(start, end, what) of each fault line."""
    out = []
    for at, rest in rows(path):
        first, _, more = rest.partition(" ")
        try:
            out.append((at, float(first), more.strip()))
        except ValueError:
            out.append((at, at, rest.strip()))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("errors")
    p.add_argument("faults")
    p.add_argument("--lossless", action="append", default=[])
    args = p.parse_args()
    faults = windows(args.faults)
    cost = {what: 0 for _, _, what in faults}
    unexplained = 0
    for at, _ in rows(args.errors):
        near = [what for start, end, what in faults if start - 1 <= at <= end + 5]
        if near:
            cost[near[0]] += 1
        else:
            unexplained += 1
    for what, n in cost.items():
        print(f"{what}: {n} lost")
    print(f"unexplained: {unexplained}")
    bad = unexplained or any(cost.get(w, 0) for w in args.lossless)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
