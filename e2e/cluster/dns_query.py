#!/usr/bin/env python3
"""Asks a DNS server for a name's A records over UDP and prints them, one a line; exits 1
when there is no answer. No resolver library: the cluster e2e asks the cluster DNS (the
kube-dns Service's ClusterIP) directly, as a pod's resolver would.

    dns_query.py SERVER NAME
"""
import random
import socket
import struct
import sys


def query(server: str, name: str, timeout: float = 3.0) -> list[str]:
    qid = random.randrange(1 << 16)
    header = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)  # recursion desired, 1 question
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    packet = header + qname + struct.pack(">HH", 1, 1)  # A, IN
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(packet, (server, 53))
        reply, _ = s.recvfrom(4096)
    rid, flags, _qd, ancount, _ns, _ar = struct.unpack(">HHHHHH", reply[:12])
    if rid != qid or flags & 0x000F:
        return []
    pos = 12 + len(qname) + 4
    addresses = []
    for _ in range(ancount):
        if reply[pos] & 0xC0 == 0xC0:  # a compressed name
            pos += 2
        else:
            while reply[pos]:
                pos += reply[pos] + 1
            pos += 1
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", reply[pos:pos + 10])
        pos += 10
        if rtype == 1 and rdlen == 4:
            addresses.append(socket.inet_ntoa(reply[pos:pos + 4]))
        pos += rdlen
    return addresses


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        found = query(sys.argv[1], sys.argv[2])
    except OSError as e:
        print(f"no answer from {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    print("\n".join(found))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
