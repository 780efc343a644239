"""``carpool doctor``: which of seed 004's six symptoms hold on a running deployment now.

Reads ``GET /admin/stats`` (the whole deployment's metrics over the rolling window and the
findings of ``policies/doctor.py``, computed by the gateway) and prints each symptom with its
evidence, cause and the knob to turn, or "no symptom" with the key numbers.

    carpool doctor [--url http://127.0.0.1:8000] [--admin-key cp-admin-...] [--json]

The URL defaults to ``CARPOOL_HOST``/``CARPOOL_PORT``, the key to ``CARPOOL_ADMIN_KEY`` (both
through ``GatewayConfig``). Exit status: 0 no symptom, 1 symptoms found, 2 no answer (server
unreachable, key refused). Imports no torch and nothing beyond the standard library's HTTP.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

MIN_WINDOW_S = 10.0  # processes publish once someone reads: wait for this much of a window


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="name the batching symptoms a running server shows now")
    p.add_argument("--url", default=None, help="gateway base URL (default from the config)")
    p.add_argument("--admin-key", default=None, help="default CARPOOL_ADMIN_KEY")
    p.add_argument("--json", action="store_true", help="print the stats JSON's doctor part")
    p.add_argument("--wait", type=float, default=20.0,
                   help="seconds to wait for a window of stats on a fresh gateway")
    p.set_defaults(func=run)


def fetch_stats(url: str, key: str, timeout: float = 10.0) -> dict[str, Any]:
    req = urllib.request.Request(url.rstrip("/") + "/admin/stats",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1000:.0f} ms"


def _n(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def render(stats: dict[str, Any], url: str) -> str:
    doc = stats["doctor"]
    head = (f"carpool doctor: {url} (window {stats['window_s']:.0f} s, "
            f"{len(stats.get('processes', {}))} process(es))")
    lines = [head]
    for f in doc["findings"]:
        evidence = "  ".join(f"{k}={v}" for k, v in f["evidence"].items())
        lines += [f"SYMPTOM {f['symptom']}: {f['title']}", f"  evidence: {evidence}",
                  f"  cause:    {f['cause']}", f"  turn:     {f['knob']}"]
    if doc["healthy"]:
        lines.append("no symptom")
    for tier, t in stats["tiers"].items():
        if t["counts"]["finished"] or t["queue_depth"]:
            lines.append(f"  {tier}: TTFT p50 {_ms(t['ttft_s']['p50'])} / p99 "
                         f"{_ms(t['ttft_s']['p99'])}, TPOT p50 {_ms(t['tpot_s']['p50'])} / p99 "
                         f"{_ms(t['tpot_s']['p99'])}, completed/s {_n(t['completed_per_s'])}, "
                         f"queue {t['queue_depth']:.0f}")
    e = stats.get("engine")
    if e:
        lines.append(f"  engine: tokens/s {_n(e['tokens_per_s'])}, rows/step p50 "
                     f"{_n(e['batch_size']['p50'])} p99 {_n(e['batch_size']['p99'])}, KV used "
                     f"{e['kv_used']:.0f}/{e['kv_total']}, preemptions recompute "
                     f"{e['preemptions']['recompute']:.0f} swap {e['preemptions']['swap']:.0f}, "
                     f"running {e['running']:.0f} waiting {e['waiting']:.0f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gateway.config import GatewayConfig

    config = GatewayConfig.from_env()
    url = args.url or f"http://{config.host}:{config.port}"
    key = args.admin_key or config.admin_key
    if not key:
        print("carpool doctor: an admin key is needed (--admin-key or CARPOOL_ADMIN_KEY)",
              file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.wait
    try:
        stats = fetch_stats(url, key)
        while stats["window_s"] < MIN_WINDOW_S and time.monotonic() < deadline:
            time.sleep(1.0)
            stats = fetch_stats(url, key)
    except urllib.error.HTTPError as exc:
        print(f"carpool doctor: {url} answered {exc.code}: {exc.read().decode(errors='replace')}",
              file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"carpool doctor: no answer from {url}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({k: stats["doctor"][k] for k in ("healthy", "findings")}, indent=2))
    else:
        print(render(stats, url))
    return 0 if stats["doctor"]["healthy"] else 1
