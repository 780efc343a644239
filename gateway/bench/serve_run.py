"""What ``carpool bench serve``'s served rows share, Carpool's (``serve.py``) and llama.cpp's
(``serve_llama.py``): the seed workload (short chat prompts, alternating short and long
answers), its run through one streaming HTTP connection a request (``sla_client``) with a
warm-up first, and the server processes the rows start and wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.bench.serve_rows import Trace
from gateway.bench.sla_client import Call, ChatTarget
from gateway.process import stop_children

TOPICS = ("the sea", "a lighthouse", "bread", "trains", "the moon", "tea", "a violin", "winter",
          "bees", "a library", "rain", "mountains", "a clock", "chess", "a garden", "rivers")
TIER = "interactive"  # a default tenant's tier


@dataclass
class Workload:
    messages: list[list[dict[str, str]]]
    output_lens: list[int]


def make_workload(n: int, short: int, long: int) -> Workload:
    msgs = [[{"role": "user", "content": f"Write about {TOPICS[i % len(TOPICS)]}"
              + (" in detail" if i % 3 == 0 else "") + "."}] for i in range(n)]
    return Workload(msgs, [short if i % 2 == 0 else long for i in range(n)])


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids the gateway makes of ``messages`` (its own chat-template path)."""
    from gateway.http.openai.schema import encode_text

    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return encode_text(tokenizer, text)


async def stream_all(target: ChatTarget, key: str, wl: Workload) -> tuple[float, list[Trace]]:
    """Every request at once; wall time from the first send to the last token."""
    bodies = [{"messages": m, "max_tokens": n, "ignore_eos": True, "temperature": 0.0}
              for m, n in zip(wl.messages, wl.output_lens)]
    start = time.perf_counter()
    calls = await asyncio.gather(*(target.chat(key, "bench", TIER, b) for b in bodies))
    traces = [_trace(c) for c in calls]
    ends = [t.times[-1] for t in traces if t.times]
    return (max(ends) - start if ends else 0.0), traces


def _trace(call: Call) -> Trace:
    error = call.error or ("" if call.status == 200 else f"HTTP {call.status}")
    return Trace(call.sent, call.max_tokens, list(call.times), call.output_tokens, error)


async def warm_and_run(target: ChatTarget, key: str, wl: Workload) -> tuple[float, list[Trace]]:
    warm = Workload(wl.messages[:2], [4, 4])
    await stream_all(target, key, warm)  # first requests pay one-off costs (JIT, allocations)
    return await stream_all(target, key, wl)


def wait_http(url: str, proc: subprocess.Popen[bytes], path: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=1).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url}{path} not ready in {timeout:.0f} s")


@contextlib.contextmanager
def process(cmd: list[str], env: dict[str, str], log: bool) -> Iterator[subprocess.Popen[bytes]]:
    out = None if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        stop_children([proc])


@dataclass(frozen=True)
class SweepTarget:
    """A server kept up for the ``--streams`` sweep: its label, client target and key."""

    server: str
    target: ChatTarget
    key: str
