"""A gateway + worker + tiny real engine in one process against its own Redis, which a test
stops and starts in place (``EmbeddedRedis(port=...)``: with a data folder and AOF it keeps
its data, without one it comes back empty); helpers for keys, streams and idle KV blocks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.bus.embedded import EmbeddedRedis
from gateway.process import free_port
from gateway.tenancy.keys import generate_key
from tests.gateway.conftest import TINY_ENGINE
from tests.gateway.harness import RunningGateway, make_config, run_gateway

ADMIN_KEY = generate_key(admin=True)
TENANTS_TOML = '[tenants.acme]\nname = "ACME"\n'


@contextmanager
def restartable_stack(tmp_path: Path, model_dir: Path, appendonly: bool, **config: Any
                      ) -> Iterator[tuple[EmbeddedRedis, RunningGateway]]:
    server = EmbeddedRedis(port=free_port(), appendonly=appendonly,
                           data_dir=tmp_path / "redis" if appendonly else None)
    url = server.start()
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS_TOML)
    cfg = make_config(engine="real", model=str(model_dir), engine_options=TINY_ENGINE,
                      tenants_file=str(tenants), admin_key=ADMIN_KEY, auth_cache_s=0.2,
                      **config)
    try:
        with run_gateway(cfg, url) as gw:
            yield server, gw
    finally:
        server.stop()


def issue_key(url: str, tenant: str = "acme") -> str | None:
    """A new key through the admin API (None while that fails)."""
    try:
        r = httpx.post(f"{url}/admin/tenants/{tenant}/keys", timeout=5,
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    except httpx.HTTPError:
        return None
    return str(r.json()["key"]) if r.status_code in (200, 201) else None


def wait_for(predicate: Any, timeout: float, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError("condition not met in time")


class StreamReader(threading.Thread):
    """Reads one streaming completion to its end: its text, whether it ended with
    ``[DONE]``, error events, and an event set once the first text arrived."""

    def __init__(self, url: str, key: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.body = url, key, {**body, "stream": True}
        self.text: list[str] = []
        self.errors: list[Any] = []
        self.done = False
        self.status: int | None = None
        self.request_id: str | None = None
        self.usage: dict[str, Any] | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=self.body, timeout=60,
                              headers={"Authorization": f"Bearer {self.key}"}) as r:
                self.status = r.status_code
                self.request_id = r.headers.get("x-request-id")
                if r.status_code != 200:
                    self.errors.append(r.read().decode())
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        self.done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        self.errors.append(event["error"])
                    elif event.get("usage"):
                        self.usage = event["usage"]
                    if event.get("choices"):
                        self.text.append(event["choices"][0].get("text") or "")
                        self.first.set()
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))
        finally:
            self.first.set()


def idle_kv_blocks(gw: RunningGateway, timeout: float = 30.0) -> int:
    """KV blocks still used once the engine has nothing left to run (0 when none leaked)."""
    def idle() -> bool:
        load = gw.engine.load()
        return load.num_running == 0 and load.num_waiting == 0

    wait_for(idle, timeout)
    time.sleep(0.2)  # a last step frees the blocks of what was aborted
    load = gw.engine.load()
    return int(load.num_total_blocks - load.num_free_blocks)
