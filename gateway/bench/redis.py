"""carpool bench redis: what Redis does per streamed token, over a grid of tenants x workers,
on one server and on a three-master Valkey Cluster (the embedded binary,
``redis_servers.py``), with the FAKE echo engine (``redis_fleet.py`` runs the processes).

Each row: one gateway and ``workers`` worker processes, each worker given ``--streams``
concurrent streaming requests of ``--tokens`` tokens (``--streams`` rows a worker), the
requests spread round-robin over the row's ``tenants`` tenants (a new slice of them each
row). With several ``--tokens`` lengths, each cell's commands per request are fitted as a
line over the lengths: the fixed cost of a request and the marginal cost of a token. Every
node's ``INFO commandstats`` (a script's inner commands included) and ``INFO cpu`` are read
around the row's batch (after a warm-up batch per fleet).

Columns: server-side commands per streamed token, commands per second per node, the busiest
node's share of the commands, and the busiest node's own CPU seconds (``used_cpu_user`` +
``used_cpu_sys``) per token. A node's main thread saturates at one core, so the token rate at
which the busiest node saturates is 1 / (its CPU seconds per token): measured, not assumed.
The fleet size at saturation divides that rate by a worker's token rate at ``--streams``
streams and ``--tpot-ms`` per token. The 1 -> 3 master ratio of the saturating token rate is
derived the same way (the single node's CPU per token over the busiest of three masters'),
since on a small machine the clients saturate before Redis does."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gateway.bench.gateway import cpu_model
from gateway.bench.redis_fleet import Sample, fleet, make_tenants, measure, stream_batch


@dataclass
class Row:
    masters: int
    workers: int
    tenants: int
    sample: Sample
    tokens: int = 0  # per request

    @property
    def per_node(self) -> list[int]:
        return [sum(c.values()) for c in self.sample.commands]

    @property
    def per_token(self) -> float:
        return sum(self.per_node) / max(1, self.sample.tokens)

    @property
    def top_share(self) -> float:
        return max(self.per_node) / max(1, sum(self.per_node))

    @property
    def cpu_per_token(self) -> float:
        """The busiest node's CPU seconds per token."""
        return max(self.sample.cpu_s) / max(1, self.sample.tokens)


def _servers(masters: int) -> tuple[Any, str, list[Any]]:
    import redis as sync_redis

    from gateway.bench.redis_servers import ValkeyCluster
    from gateway.bus.embedded import EmbeddedRedis

    if masters > 1:
        cluster = ValkeyCluster(masters=masters).start()
        return cluster, cluster.url, [n.client for n in cluster.masters]
    single = EmbeddedRedis()
    url = single.start()
    return single, url, [sync_redis.Redis.from_url(url)]


def run_masters(masters: int, args: argparse.Namespace) -> list[Row]:
    server, url, nodes = _servers(masters)
    rows = []
    try:
        keys = asyncio.run(make_tenants(url, max(args.tenants), []))
        for workers in args.workers:
            streams = args.streams * workers
            with fleet(url, workers, args) as base:
                asyncio.run(stream_batch(base, keys, streams, args.tokens[0], 0))  # warm-up
                offset = streams
                for n in args.tenants:
                    for length in args.tokens:
                        sample = measure(nodes, lambda n=n, o=offset, s=streams, t=length:
                                         asyncio.run(stream_batch(base, keys[:n], s, t, o)))
                        offset += streams
                        rows.append(Row(masters, workers, n, sample, length))
                        print(f"  {masters} master(s), {workers} worker(s), {n} tenants, "
                              f"{length} tokens: {rows[-1].per_token:.2f} commands/token",
                              flush=True)
    finally:
        server.stop()
    return rows


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    worker_rate = args.streams * 1000 / args.tpot_ms
    print("| masters | workers | tenants | tokens / request | commands / token | tokens / s | "
          "commands / s per node | busiest node | busiest node CPU us / token | tokens / s one "
          "node saturates at | workers at saturation |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r.sample
        nodes = ", ".join(f"{n / s.secs:,.0f}" for n in r.per_node)
        sat = 1 / r.cpu_per_token if r.cpu_per_token > 0 else float("inf")
        print(f"| {r.masters} | {r.workers} | {r.tenants:,} | {r.tokens} | {r.per_token:.2f} | "
              f"{s.tokens / s.secs:,.0f} | {nodes} | {r.top_share:.0%} | "
              f"{r.cpu_per_token * 1e6:.1f} | {sat:,.0f} | {sat / worker_rate:,.0f} |")


def print_breakdown(rows: list[Row]) -> None:
    """Commands per token by name, summed over the nodes, of each master count's rows."""
    by: dict[int, Counter[str]] = {}
    tokens: Counter[int] = Counter()
    for r in rows:
        by.setdefault(r.masters, Counter()).update(
            sum(r.sample.commands, Counter()))
        tokens[r.masters] += r.sample.tokens
    names = sorted({n for c in by.values() for n in c}, key=lambda n: -max(
        c[n] / tokens[m] for m, c in by.items()))
    print("\n| command | " + " | ".join(f"{m} master(s) / token" for m in by) + " |")
    print("|---|" + "---|" * len(by))
    for n in names:
        cells = [by[m][n] / tokens[m] for m in by]
        if max(cells) >= 0.005:
            print(f"| {n} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


def print_fit(rows: list[Row]) -> None:
    """Each cell's commands per request as a line over the request lengths measured (least
    squares): the fixed cost of a request and the marginal cost of a streamed token."""
    cells: dict[tuple[int, int, int], list[Row]] = {}
    for r in rows:
        cells.setdefault((r.masters, r.workers, r.tenants), []).append(r)
    fits = {k: fit_line([(r.tokens, r.per_token * r.tokens) for r in v])
            for k, v in cells.items() if len({r.tokens for r in v}) > 1}
    if not fits:
        return
    print("\n| masters | workers | tenants | commands / request (fixed) | commands / token "
          "(marginal) |")
    print("|---|---|---|---|---|")
    for (m, w, n), (fixed, marginal) in fits.items():
        print(f"| {m} | {w} | {n:,} | {fixed:.1f} | {marginal:.2f} |")


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line through ``points`` (x, y): (intercept, slope)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def print_ratio(rows: list[Row]) -> None:
    """The 1 -> 3 master ratio of the saturating token rate, per (workers, tenants) cell and
    over all rows, derived from the measured per-node cost."""
    one = {(r.workers, r.tenants, r.tokens): r for r in rows if r.masters == 1}
    three = {(r.workers, r.tenants, r.tokens): r for r in rows if r.masters == 3}
    both = sorted(one.keys() & three.keys())
    if not both:
        return
    cpu = [one[k].cpu_per_token / three[k].cpu_per_token for k in both]
    cmd = [one[k].per_token / (three[k].per_token * three[k].top_share) for k in both]
    print(f"\n1 -> 3 masters, saturating token rate, derived from the measured per-node cost "
          f"(not a measured saturation): by CPU per token {min(cpu):.2f}x to {max(cpu):.2f}x "
          f"(median {sorted(cpu)[len(cpu) // 2]:.2f}x); by commands per token on the busiest "
          f"node {min(cmd):.2f}x to {max(cmd):.2f}x; busiest of three masters at most "
          f"{max(three[k].top_share for k in both):.0%} of the commands")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="carpool bench redis", description=__doc__)
    p.add_argument("--tenants", type=_ints, default=[100, 1000, 10000], help="comma list")
    p.add_argument("--workers", type=_ints, default=[1, 4, 16], help="comma list")
    p.add_argument("--masters", type=_ints, default=[1, 3], help="comma list of 1 and 3")
    p.add_argument("--streams", type=int, default=32, help="concurrent streams per worker")
    p.add_argument("--tokens", type=_ints, default=[64],
                   help="tokens per request, comma list (two or more: the fixed and marginal "
                   "costs are fitted)")
    p.add_argument("--step-ms", type=float, default=5.0, help="echo engine step time")
    p.add_argument("--tpot-ms", type=float, default=25.0,
                   help="a production worker's time per output token, for the fleet column")
    p.add_argument("--model", default=None, help="tokenizer source dir (default: SmolLM2)")
    args = p.parse_args(argv)
    if set(args.masters) - {1, 3}:
        p.error("--masters takes 1 and/or 3")
    rows = [r for m in args.masters for r in run_masters(m, args)]
    print(f"\ncarpool bench redis: FAKE echo engine ({args.step_ms:g} ms steps), one gateway, "
          f"{args.streams} streams per worker, {'/'.join(map(str, args.tokens))} tokens a "
          f"request; {cpu_model()}\n")
    print_table(rows, args)
    print_fit(rows)
    print_breakdown(rows)
    print_ratio(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
