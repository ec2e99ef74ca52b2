#!/usr/bin/env python3
"""Writes sample-chat.jsonl: ten minutes of chat traffic in three tiers (enterprise,
standard, free), about 1 request/s with a burst to 3/s in minutes 4-6, multi-turn sessions
whose prompts carry the conversation so far. Small on purpose: CI replays it through
examples/inferencepool-llama-8b.yaml. Deterministic (seeded).

    python3 examples/traces/gen-sample-chat.py > examples/traces/sample-chat.jsonl
"""
import json
import math
import random
import sys

TIERS = [("enterprise", 0.1), ("standard", 0.3), ("free", 0.6)]


def main(seed=11):
    rng = random.Random(seed)
    tenants = []
    for i in range(60):
        u, acc = rng.random(), 0.0
        for name, share in TIERS:
            acc += share
            if u < acc:
                break
        tenants.append(("t%02d" % i, name))
    sys.stdout.write("# sample chat traffic, 10 min; gen-sample-chat.py seed %d\n" % seed)
    arrivals = []
    t, session = 0.0, 0
    while t < 600:
        t += rng.expovariate(3.0 if 240 <= t < 360 else 1.0)
        if t >= 600:
            break
        tenant, tier = rng.choice(tenants)
        session += 1
        context, at = 0, t
        for turn in range(rng.randint(1, 3)):
            prompt = context + min(4000, max(16, int(rng.lognormvariate(math.log(400), 0.7))))
            output = min(1024, max(16, int(rng.lognormvariate(math.log(200), 0.7))))
            if at < 600:
                arrivals.append((round(at, 3), tenant, tier, prompt, output, "s%d" % session))
            context = prompt + output
            at += 20 + rng.expovariate(1 / 40.0)
    arrivals.sort(key=lambda a: a[0])
    for a in arrivals:
        keys = ("t", "tenant", "tier", "prompt_tokens", "output_tokens", "session")
        sys.stdout.write(json.dumps(dict(zip(keys, a)), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
