"""Run the Locust file headless against a deployment and write the per-tier report.

``run_loadtest`` is what ``carpool loadtest`` calls: with no ``host`` it starts a local
deployment (``local_server``) and gives Locust its keys; with a ``host`` it only drives that
deployment, with keys from ``keys`` or Locust's own ``LOCUST_CARPOOL_KEYS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.report import TIERS, TierReport, write_report

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")  # installed beside this module


@dataclass(frozen=True)
class LoadTestOptions:
    out_dir: Path
    users: int = 6
    spawn_rate: float = 0.0  # 0 = all users at once
    run_time: str = "60s"  # Locust's format: 30s, 2m, 1h30m
    mix: str = "chat=0.8,summary=0.2"
    chat: str = "24:32"  # prompt words : max_tokens
    summary: str = "400:128"
    model: str = ""  # the name to send; "" = the first of GET /v1/models
    locustfile: Path = LOCUSTFILE
    stop_timeout_s: int = 30  # let requests in flight finish when the time is up
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.users < len(TIERS):  # Locust spreads users over the classes, one per tier
            raise ValueError(f"users must be >= {len(TIERS)}, so that every tier has one")
        if not self.locustfile.is_file():
            raise ValueError(f"locustfile not found: {self.locustfile}")


def locust_command(opts: LoadTestOptions, host: str, log_path: Path) -> list[str]:
    spawn = opts.spawn_rate or opts.users
    return [
        sys.executable, "-m", "locust", "-f", str(opts.locustfile), "--headless",
        "--host", host, "--users", str(opts.users), "--spawn-rate", str(spawn),
        "--run-time", opts.run_time, "--stop-timeout", str(opts.stop_timeout_s),
        "--only-summary", "--csv", str(opts.out_dir / "locust"),
        "--html", str(opts.out_dir / "locust.html"),
        "--carpool-log", str(log_path), "--carpool-mix", opts.mix,
        "--carpool-chat", opts.chat, "--carpool-summary", opts.summary,
        *(["--carpool-model", opts.model] if opts.model else []),
    ]


def run_locust(opts: LoadTestOptions, host: str, keys: Mapping[str, str] | None) -> tuple[
        float, float, int]:
    """Run Locust to completion; returns (start, end, exit code). Locust's own output goes to
    ``locust.log`` in the report folder; keys travel in its environment, not its arguments."""
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = opts.out_dir / "requests.jsonl"
    log_path.unlink(missing_ok=True)
    env = {**os.environ, **opts.extra_env}
    if keys:
        env["LOCUST_CARPOOL_KEYS"] = ",".join(f"{t}={k}" for t, k in keys.items())
    start = time.time()
    with open(opts.out_dir / "locust.log", "w", encoding="utf-8") as out:
        proc = subprocess.run(locust_command(opts, host, log_path), env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    return start, time.time(), proc.returncode


def run_loadtest(opts: LoadTestOptions, host: str | None = None,
                 keys: Mapping[str, str] | None = None, serve: Any = None,
                 meta: Mapping[str, Any] | None = None) -> list[TierReport]:
    """Drive ``host`` (or the local deployment ``serve()`` yields) and write the report."""
    info = dict(meta or {})
    info.update(users=opts.users, run_time=opts.run_time, mix=opts.mix)
    if host is not None:
        start, end, code = run_locust(opts, host, keys)
        return _report(opts, start, end, {**info, "host": host, "locust_exit": code})
    assert serve is not None, "no host and no local server"
    with serve() as server:
        start, end, code = run_locust(opts, server.url, server.keys)
        _save_metrics(server.url, opts.out_dir / "metrics.txt")
    return _report(opts, start, end, {**info, "host": "local", "locust_exit": code})


def _report(opts: LoadTestOptions, start: float, end: float,
            meta: dict[str, Any]) -> list[TierReport]:
    return write_report(opts.out_dir / "requests.jsonl", opts.out_dir, start=start, end=end,
                        meta=meta)


def _save_metrics(url: str, path: Path) -> None:
    """Keep the server's Prometheus text beside the report (best effort)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            path.write_bytes(resp.read())
    except OSError:
        pass
