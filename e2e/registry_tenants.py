#!/usr/bin/env python3
"""Prints the tenant ids of a tenant registry, one a line: from a file (local mode's
registry) or from standard input (`-`; a cluster's ConfigMap binaryData, base64-decoded).
The encoding is operator/src/registry.rs's: deflated; a version byte, the tier table, the
count, the newest admission, then front-coded ids.

    registry_tenants.py FILE|-
"""
import os
import sys
import zlib


def tenants(raw: bytes) -> list[str]:
    data = zlib.decompress(raw, -15)
    pos = 1

    def varint() -> int:
        nonlocal pos
        n = shift = 0
        while True:
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return n

    def blob() -> bytes:
        nonlocal pos
        n = varint()
        pos += n
        return data[pos - n:pos]

    assert data[0] == 1, "registry format version"
    for _ in range(varint()):
        blob()
    count, _newest = varint(), varint()
    out, prev = [], b""
    for _ in range(count):
        shared = varint()
        prev = prev[:shared] + blob()
        out.append(prev.decode())
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    raw = sys.stdin.buffer.read() if sys.argv[1] == "-" else open(sys.argv[1], "rb").read()
    try:
        print("\n".join(tenants(raw)), flush=True)
    except BrokenPipeError:
        # A reader that stops early (`grep -q`, `grep -m1`) is not an error: with the
        # callers' pipefail it would turn a match into a failure.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
