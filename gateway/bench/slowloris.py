"""``python -m gateway.bench.slowloris``: what slowloris sockets cost a normal request.

Starts ``carpool serve --engine echo`` (embedded Redis), measures the latency of sequential
non-streaming completions alone, then with ``--sockets`` connections open that send their
request headers one byte a second (half of them sending nothing at all), and reports both
p50s, their ratio, and how long the server took to close every slow socket (its header
timeout, ``CARPOOL_HEADER_TIMEOUT_S``, default 10 s). Run it under the benchmark lock.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time

import httpx

from gateway.bench.gateway import make_key, serving
from gateway.bus.embedded import EmbeddedRedis
from gateway.process import free_port


def latencies(url: str, key: str, n: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        for _ in range(n):
            t = time.perf_counter()
            r = client.post("/v1/completions", json={"model": "echo", "prompt": "hello there",
                                                     "max_tokens": 4})
            out.append(time.perf_counter() - t)
            r.raise_for_status()
    return out


def open_slow(port: int, n: int) -> list[socket.socket]:
    socks = []
    for i in range(n):
        sock = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nx-slow: ")
        sock.setblocking(False)
        socks.append(sock)
    return socks


def dribble(socks: list[socket.socket], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        for sock in socks:
            try:
                sock.send(b"x")
            except OSError:
                pass


def is_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def run(args: argparse.Namespace) -> str:
    with EmbeddedRedis() as redis:
        port = free_port()
        key = asyncio.run(make_key(redis.url))
        with serving(redis.url, port, args, ("all",)):
            url = f"http://127.0.0.1:{port}"
            latencies(url, key, 50)  # warm-up
            alone = latencies(url, key, args.requests)
            socks = open_slow(port, args.sockets)
            opened, stop = time.monotonic(), threading.Event()
            threading.Thread(target=dribble, args=(socks, stop), daemon=True).start()
            beside = latencies(url, key, args.requests)
            left = socks
            while left and time.monotonic() - opened < 60:
                left = [s for s in left if not is_closed(s)]
                time.sleep(0.2)
            closed_after = time.monotonic() - opened
            stop.set()
            for s in socks:
                s.close()
    p_alone, p_beside = statistics.median(alone) * 1e3, statistics.median(beside) * 1e3
    return "\n".join([
        "| case | p50 ms | p99 ms | p50 ratio |", "|---|---|---|---|",
        f"| alone | {p_alone:.2f} | {_p99(alone):.2f} | 1.00 |",
        (f"| beside {args.sockets} slowloris sockets | {p_beside:.2f} | {_p99(beside):.2f} "
        f"| {p_beside / p_alone:.2f} |"),
        (f"\n{args.sockets - len(left)}/{args.sockets} slow sockets closed by the server "
        f"{closed_after:.1f} s after they opened")])


def _p99(xs: list[float]) -> float:
    return sorted(xs)[int(0.99 * (len(xs) - 1))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=1.0)
    parser.add_argument("--model", default=None)
    print(run(parser.parse_args()))


if __name__ == "__main__":
    main()
