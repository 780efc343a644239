"""What ``carpool bench serve`` concludes from its rows: issue 12's targets, met or missed.

Rows say which server made them (``Row.server``: ``Carpool offline``, ``Carpool fp32``,
``Carpool int8``, ``llama-server F32, 64 slots``, ...) and, for a ``--streams`` row, how many
streams (``Row.streams``; 0 is the seed workload).

- ``seed_ratios``: Carpool fp32 served / offline (target >= 0.9), and served / the best
  llama-server seed row (target >= 1.5) for the fastest Carpool served row and for fp32.
- ``streams_table``: guidellm's table, one line per stream count, one column per server with
  streams rows: output tok/s / ITL p50.
- ``streams_targets``: per Carpool server with streams rows, against the first llama-server
  F32 one (the same weights), and Carpool int8 also against the first Q8_0 one (int8 weights
  too): output tok/s >= it at every level, and ITL p50 at 1 stream <= it.
"""

from __future__ import annotations

import math

from gateway.bench.serve_rows import Row, fmt

OFFLINE = "Carpool offline"


def _served(rows: list[Row]) -> list[Row]:
    return [r for r in rows if not r.streams and r.server.startswith("Carpool ")
            and r.server != OFFLINE]


def seed_ratios(rows: list[Row]) -> list[str]:
    seed = [r for r in rows if not r.streams]
    offline = next((r for r in seed if r.server == OFFLINE), None)
    served = _served(rows)
    fp32 = next((r for r in served if r.server == "Carpool fp32"), None)
    lines = []
    if offline and fp32:
        lines.append(f"served / offline (fp32) = {fp32.tok_s / offline.tok_s:.2f}  "
                     f"(target >= 0.90)")
    llama = [r for r in seed if r.server.startswith("llama-server")]
    if not (served and llama):
        return lines
    best = max(llama, key=lambda r: r.tok_s)
    fastest = max(served, key=lambda r: r.tok_s)
    for row in [fastest] + ([fp32] if fp32 is not None and fp32 is not fastest else []):
        what = "fastest Carpool" if row is fastest else "fp32"
        lines.append(f"served / best llama-server = {row.tok_s / best.tok_s:.2f}  "
                     f"({what}: {row.server} {row.tok_s:.1f} tok/s / {best.server} "
                     f"{best.tok_s:.1f}; target >= 1.5)")
    return lines


def _by_server(rows: list[Row]) -> dict[str, dict[int, Row]]:
    out: dict[str, dict[int, Row]] = {}
    for r in rows:
        if r.streams:
            out.setdefault(r.server, {})[r.streams] = r
    return out


def _cell(row: Row | None) -> str:
    if row is None:
        return "-"
    return f"{fmt(row.tok_s, '{:.1f}')} / {fmt(1000 * row.itl(50), '{:.0f}')} ms"


def streams_table(rows: list[Row]) -> str:
    """Markdown: per stream count, each server's output tok/s / ITL p50; "" without any."""
    by = _by_server(rows)
    if not by:
        return ""
    levels = sorted({n for per in by.values() for n in per})
    lines = ["| streams | " + " | ".join(f"{s}: out tok/s / ITL p50" for s in by) + " |",
             "|---|" + "---|" * len(by)]
    for n in levels:
        lines.append(f"| {n} | " + " | ".join(_cell(per.get(n)) for per in by.values()) + " |")
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _references(server: str, servers: list[str]) -> list[str]:
    """The llama-servers a Carpool server's streams are held against: the first F32 one (the
    issue's target: the same weights), and for int8 the first Q8_0 one (int8 weights too)."""
    kinds = ["F32"] + (["Q8_0"] if server == "Carpool int8" else [])
    found = (next((s for s in servers if s.startswith(f"llama-server {k},")), None)
             for k in kinds)
    return [s for s in found if s is not None]


def streams_targets(rows: list[Row]) -> list[str]:
    by = _by_server(rows)
    lines = []
    for server, per in by.items():
        if not server.startswith("Carpool "):
            continue
        for ref_name in _references(server, list(by)):
            lines += _against(server, per, ref_name, by[ref_name])
    return lines


def _against(server: str, per: dict[int, Row], ref_name: str, ref: dict[int, Row]) -> list[str]:
    levels = sorted(set(per) & set(ref))
    pairs = [(n, per[n].tok_s, ref[n].tok_s) for n in levels]
    ok = bool(pairs) and all(a >= b for _, a, b in pairs)
    detail = ", ".join(f"{n}: {a:.1f} vs {b:.1f}" for n, a, b in pairs)
    lines = [f"{server} out tok/s >= {ref_name} at every level: {_verdict(ok)} ({detail})"]
    if 1 in per and 1 in ref:
        a, b = 1000 * per[1].itl(50), 1000 * ref[1].itl(50)
        ok = not math.isnan(a) and a <= b
        lines.append(f"{server} ITL p50 at 1 stream <= {ref_name}: {_verdict(ok)} "
                     f"({a:.0f} vs {b:.0f} ms)")
    return lines
