#!/usr/bin/env python3
"""Writes llmd-ramp.csv: llm-d's published autoscaling scenario, a ramp of 2 -> 10 -> 1
requests/s, as a trace file for `tidegate-operator simulate --trace-file`.

Shape (seconds): 0-600 at 2/s; 600-1200 rising to 10/s; 1200-2400 at 10/s; 2400-3000
falling to 1/s; 3000-3600 at 1/s. Poisson arrivals; 40 tenants, one tier ("default": the
pool has no tierPolicyRef); log-normal prompts (median 512 tokens) and outputs (median 150).
Deterministic: the same seed writes the same file (Python's Mersenne Twister).

    python3 examples/traces/gen-llmd-ramp.py > examples/traces/llmd-ramp.csv
    python3 examples/traces/gen-llmd-ramp.py --seed 3 > llmd-ramp-3.csv   # other traffic, same shape

The checked-in file is seed 7; scripts/llmd-seeds.sh replays other seeds of the same shape.
"""
import math
import random
import sys

SEGMENTS = [(0, 600, 2.0, 2.0), (600, 1200, 2.0, 10.0), (1200, 2400, 10.0, 10.0),
            (2400, 3000, 10.0, 1.0), (3000, 3600, 1.0, 1.0)]


def rate(t):
    for a, b, r0, r1 in SEGMENTS:
        if a <= t < b:
            return r0 + (r1 - r0) * (t - a) / (b - a)
    return 0.0


def main(seed=7):
    rng = random.Random(seed)
    out = sys.stdout
    out.write("# llm-d ramp 2 -> 10 -> 1 req/s, 60 min; gen-llmd-ramp.py seed %d\n" % seed)
    out.write("t,tenant,tier,prompt_tokens,output_tokens\n")
    peak = 10.0
    t = 0.0
    while True:
        # Thinning: candidates at the peak rate, kept with probability rate(t) / peak.
        t += rng.expovariate(peak)
        if t >= SEGMENTS[-1][1]:
            break
        if rng.random() >= rate(t) / peak:
            continue
        tenant = "u%02d" % rng.randrange(40)
        prompt = min(4096, max(16, int(rng.lognormvariate(math.log(512), 0.5))))
        output = min(1024, max(16, int(rng.lognormvariate(math.log(150), 0.6))))
        out.write("%.3f,%s,default,%d,%d\n" % (t, tenant, prompt, output))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        sys.exit(0)
    if len(args) == 2 and args[0] == "--seed" and args[1].isdigit():
        main(int(args[1]))
    elif not args:
        main()
    else:
        sys.exit("usage: gen-llmd-ramp.py [--seed N]  (N a non-negative integer; default 7)")
