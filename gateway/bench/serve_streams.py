"""Interactive rows of ``carpool bench serve`` (``--streams 1 8 32``): what guidellm's
concurrency sweep measures (its settings in issue 12: 32-token prompts, 64 output tokens,
``ignore_eos``), with the same client as the seed rows.

N streams, each a closed loop: send a chat request (a user message of exactly 32 tokens in
SmolLM2's tokenizer, as guidellm's synthetic prompts are, which the server's chat template
wraps; 64 output tokens, ``ignore_eos``, greedy), read it to its end, send the next, for
``seconds``.
The requests open when the window ends run to their end, but only their tokens received inside
the window count (one content event is one token while the client keeps up). Output tok/s =
tokens received / window; ITL = gaps between content events of every request, pooled
(``serve_rows``).
"""

from __future__ import annotations

import asyncio
import time

from gateway.bench.serve_rows import Row, Trace
from gateway.bench.sla_client import Call, ChatTarget

PROMPT = ("Tell me, in plain words and with one short example, how {topic} changes over a whole "
          "year and why the people who live near it care about that.")  # 32 tokens each topic
TOPICS = ("the sea", "a river", "a forest", "a city", "a glacier", "a desert", "a lake", "a farm")
OUTPUT_TOKENS = 64


async def _stream(target: ChatTarget, key: str, tier: str, index: int, stop: float,
                  calls: list[Call]) -> None:
    n = 0
    while time.perf_counter() < stop:
        topic = TOPICS[(index + n) % len(TOPICS)]
        body = {"messages": [{"role": "user", "content": PROMPT.format(topic=topic)}],
                "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}
        n += 1
        # the last request of a stream runs to its end; only its tokens before ``stop`` count
        calls.append(await target.chat(key, "bench", tier, body))


async def streams_row(name: str, target: ChatTarget, key: str, tier: str, streams: int,
                      seconds: float) -> Row:
    calls: list[Call] = []
    start = time.perf_counter()
    stop = start + seconds
    await asyncio.gather(*(_stream(target, key, tier, i, stop, calls) for i in range(streams)))
    traces = []
    for c in calls:
        times = [t for t in c.times if t <= stop]
        cut = len(times) < len(c.times)  # a request the window's end cut: asked what it got
        # uncut: the usage count (an event whose token adds no text yet is not seen as one)
        tokens = len(times) if cut else c.output_tokens
        traces.append(Trace(c.sent, tokens if cut else c.max_tokens, times, tokens,
                            c.error or ("" if c.status == 200 else f"HTTP {c.status}")))
    return Row(f"{name}, {streams} streams x {seconds:.0f} s", stop - start, traces,
               server=name, streams=streams)
