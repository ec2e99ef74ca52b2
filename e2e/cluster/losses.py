#!/usr/bin/env python3
"""What each fault cost the load: the load's lost requests (e2e/load.py --errors-out: "unix-time
kind" a line) put against the faults ("unix-time what" a line), a loss counted against a fault
when it came within a second before it to five seconds after it.

Prints one line per fault ("what: N lost") and, last, "unexplained: N". Exits 1 when a loss
belongs to no engine fault, or when a fault listed in --lossless (a router deleted) lost any.

  losses.py ERRORS FAULTS [--lossless WHAT]...
"""
import argparse
import sys


def rows(path):
    with open(path) as f:
        return [(float(at), what) for at, what in (line.split(None, 1) for line in f if line.strip())]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("errors")
    p.add_argument("faults")
    p.add_argument("--lossless", action="append", default=[])
    args = p.parse_args()
    faults = rows(args.faults)
    cost = {what.strip(): 0 for _, what in faults}
    unexplained = 0
    for at, _ in rows(args.errors):
        near = [what.strip() for t, what in faults if t - 1 <= at <= t + 5]
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
