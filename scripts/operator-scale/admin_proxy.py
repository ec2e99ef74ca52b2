#!/usr/bin/env python3
"""The admin port of every simulated pod, for scripts/bench-operator-scale.sh.

Simulated (kwok) pods have loopback addresses, so the operator's admin calls to any of them
arrive here, on the admin port all pods share. Engines and routers use the same port, so this
sends each call on by its path: the router's endpoints API to one real router, everything
else (policy, tenants, drain) to one real engine. Both check the pool's admin token as in a
pod. Answers are passed back unchanged; only the framing is redone (keep-alive to the
operator, one connection per call to the backends).
"""
import argparse
import asyncio

ROUTER_PATHS = ("/admin/v1/endpoints",)


async def read_message(reader):
    """(first line, headers as a list, body) of one HTTP/1.1 message; None at EOF."""
    first = await reader.readline()
    if not first:
        return None
    headers = []
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return first.decode("latin-1").rstrip("\r\n"), headers, body


async def forward(backend, first, headers, body):
    host, port = backend
    r, w = await asyncio.open_connection(host, port)
    keep = [(k, v) for k, v in headers if k.lower() not in ("connection", "host", "content-length")]
    # HTTP/1.0 to the backend: its answer then ends at EOF, never chunked.
    method, target, _ = first.split(" ", 2)
    out = [f"{method} {target} HTTP/1.0", f"Host: {host}:{port}", "Connection: close",
           f"Content-Length: {len(body)}"]
    out += [f"{k}: {v}" for k, v in keep]
    w.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
    await w.drain()
    status = (await r.readline()).decode("latin-1").rstrip("\r\n")
    status = "HTTP/1.1 " + status.split(" ", 1)[1] if " " in status else "HTTP/1.1 502 Bad Gateway"
    resp_headers = []
    while True:
        line = await r.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() not in ("connection", "content-length", "transfer-encoding"):
            resp_headers.append((name.strip(), value.strip()))
    resp_body = await r.read()
    w.close()
    return status, resp_headers, resp_body


def handler(engine, router):
    async def serve(reader, writer):
        try:
            while True:
                msg = await read_message(reader)
                if msg is None:
                    break
                first, headers, body = msg
                path = first.split(" ")[1] if " " in first else "/"
                backend = router if path.startswith(ROUTER_PATHS) else engine
                try:
                    status, h, b = await forward(backend, first, headers, body)
                except OSError as e:
                    status, h, b = "HTTP/1.1 502 Bad Gateway", [], str(e).encode()
                lines = [status] + [f"{k}: {v}" for k, v in h] + [f"Content-Length: {len(b)}"]
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + b)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
    return serve


def hostport(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=hostport, required=True, help="HOST:PORT to serve on")
    ap.add_argument("--engine", type=hostport, required=True, help="the engine's admin HOST:PORT")
    ap.add_argument("--router", type=hostport, required=True, help="the router's admin HOST:PORT")
    args = ap.parse_args()
    server = await asyncio.start_server(handler(args.engine, args.router), *args.listen, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
