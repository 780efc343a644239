"""The fault scenarios' table: one row per scenario, and the load that fills it (client
threads sending small requests while a fault is injected, each outcome classified)."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Self

import httpx


@dataclass
class FaultRow:
    scenario: str
    requests: int = 0
    completed: int = 0
    clear_errors: int = 0  # 4xx/503 with an OpenAI-style body and a code
    server_errors: int = 0  # any other 5xx, or a response that is not an error body
    transport_errors: int = 0  # connection reset/refused: no HTTP answer at all
    recovery_s: float | None = None
    kv_blocks_after_idle: int | None = None
    codes: dict[str, int] = field(default_factory=dict)

    def record(self, status: int | None, body: Any) -> None:
        self.requests += 1
        if status is None:
            self.transport_errors += 1
            return
        if status == 200:
            self.completed += 1
            return
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        if code and (status < 500 or status == 503):
            self.clear_errors += 1
            self.codes[code] = self.codes.get(code, 0) + 1
        else:
            self.server_errors += 1


ROWS: list[FaultRow] = []


@dataclass
class LedgerRow:
    """The ledger check of a scenario: the completion tokens its clients received against
    the usage ledger's for the tenant (``gateway/tenancy/ledger.py``)."""

    scenario: str
    received: int
    ledger: int
    requests: int = 0

    @property
    def drift(self) -> int:
        return self.ledger - self.received


LEDGER_ROWS: list[LedgerRow] = []


def render_ledger(rows: list[LedgerRow]) -> list[str]:
    out = ["| scenario | requests | tokens clients received | tokens in the ledger | drift |",
           "|---|---|---|---|---|"]
    out += [f"| {r.scenario} | {r.requests} | {r.received} | {r.ledger} | {r.drift} |"
            for r in rows]
    return out


def ledger_tokens(redis_url: str, ns: str, tenant: str) -> int:
    """The completion tokens of ``tenant`` in the usage ledger (every hour it has)."""
    from gateway.bus.keys import RedisKeys
    from gateway.tenancy.ledger import rows_from_hash
    from tests.gateway.harness import redis_sync

    r = redis_sync(redis_url)
    try:
        return sum(row.completion_tokens
                   for key in r.scan_iter(RedisKeys(ns).usage(tenant, "*"))
                   for row in rows_from_hash(tenant, "", r.hgetall(key)))
    finally:
        r.close()


def ledger_check(redis_url: str, ns: str, tenant: str, scenario: str, received: int,
                 requests: int, timeout: float = 15.0) -> LedgerRow:
    """Wait (up to ``timeout``: settles run as each relay ends) until the ledger of
    ``tenant`` counts ``received`` completion tokens, then record the row either way."""
    deadline = time.monotonic() + timeout
    while (got := ledger_tokens(redis_url, ns, tenant)) != received and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    out = LedgerRow(scenario, received, got, requests)
    LEDGER_ROWS.append(out)
    return out


def summary_lines() -> list[str]:
    """The tables printed at the end of a run (empty when no scenario ran)."""
    out: list[str] = []
    if ROWS:
        out += ["", "fault scenarios:", *render(ROWS)]
    if LEDGER_ROWS:
        out += ["", "ledger check (completion tokens):", *render_ledger(LEDGER_ROWS)]
    return out


def export() -> dict[str, list[dict[str, Any]]]:
    """This process's rows as plain data: a pytest-xdist worker hands them to the controller,
    which prints the tables (``absorb``)."""
    return {"fault_rows": [asdict(r) for r in ROWS],
            "ledger_rows": [asdict(r) for r in LEDGER_ROWS]}


def absorb(output: dict[str, Any]) -> None:
    """Add a worker's ``export`` to this process's rows."""
    ROWS.extend(FaultRow(**row) for row in output.get("fault_rows", []))
    LEDGER_ROWS.extend(LedgerRow(**row) for row in output.get("ledger_rows", []))


def render(rows: list[FaultRow]) -> list[str]:
    header = ("| scenario | requests | completed | clear errors | 5xx | no answer | recovery s "
              "| KV blocks after idle | error codes |")
    out = [header, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
        kv = "-" if r.kv_blocks_after_idle is None else str(r.kv_blocks_after_idle)
        out.append(f"| {r.scenario} | {r.requests} | {r.completed} | {r.clear_errors} | "
                   f"{r.server_errors} | {r.transport_errors} | {rec} | {kv} | "
                   f"{', '.join(f'{k}={v}' for k, v in sorted(r.codes.items())) or '-'} |")
    return out


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[int | None, Any]:
    try:
        r = client.post(path, json=body)
    except httpx.HTTPError:
        return None, None
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


class Load:
    """``threads`` clients posting ``body`` to ``path`` in a loop until stopped; each
    outcome goes to ``row`` (and, with its time, to ``log``)."""

    def __init__(self, url: str, key: str, row: FaultRow, body: dict[str, Any],
                 path: str = "/v1/completions", threads: int = 3) -> None:
        self.url, self.key, self.row, self.body, self.path = url, key, row, body, path
        self.log: list[tuple[float, int | None, Any]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30,
                          headers={"Authorization": f"Bearer {self.key}"}) as client:
            while not self._stop.is_set():
                status, body = post(client, self.path, self.body)
                with self._lock:
                    self.row.record(status, body)
                    self.log.append((time.monotonic(), status, body))
                if status != 200:
                    time.sleep(0.05)

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(40)

    def first_ok_after(self, t0: float) -> float | None:
        with self._lock:
            times = [t for t, status, _ in self.log if status == 200 and t >= t0]
        return min(times) - t0 if times else None
