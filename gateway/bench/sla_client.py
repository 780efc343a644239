"""The streaming client of ``carpool bench sla``: one chat completion per TCP connection,
read event by event on asyncio streams, so the time of each content event is known.

A ``Call`` is created before its request is sent and filled in as the answer arrives, so a
call cut short (its task cancelled: the connection is closed, the gateway sees the client
leave and cancels the request) still says what it got. TTFT is the first event carrying
content; TPOT is ``(last - first) / (tokens - 1)`` with ``tokens`` from the usage chunk (an
event may carry several tokens when the client lags). Also here: the few lines of Prometheus
text parsing the bench reads ``/metrics`` with.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

SHED_STATUSES = (429, 503)


@dataclass
class Call:
    tenant: str
    tier: str
    sent: float  # perf_counter when the request was written
    max_tokens: int = 0  # asked for
    status: int = 0  # 0: no status line yet (cut short before, or the connection failed)
    first: float | None = None  # first content event
    last: float | None = None  # last content event
    events: int = 0  # content events seen
    tokens: int | None = None  # completion tokens from the usage chunk
    prompt_tokens: int | None = None  # and prompt tokens
    done: bool = False  # [DONE] seen: the request ran to its end
    cancelled: bool = False
    error: str = ""  # transport error or an error event inside the stream
    retry_after: str | None = None
    body: bytes = b""  # of a non-200 answer
    times: list[float] = field(default_factory=list)  # perf_counter of each content event

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if self.first is None or self.last is None or n < 2:
            return None
        return (self.last - self.first) / (n - 1)

    @property
    def output_tokens(self) -> int:
        """Tokens received: the usage count when the stream ended, else one per event."""
        return self.tokens if self.tokens is not None else self.events

    @property
    def is_5xx(self) -> bool:
        return self.status >= 500 and not self.shed

    @property
    def shed(self) -> bool:
        """Answered at once by early shedding (429/503 with Retry-After), not a failure."""
        return self.status in SHED_STATUSES and self.retry_after is not None


@dataclass
class ChatTarget:
    host: str
    port: int
    model: str
    calls: list[Call] = field(default_factory=list)  # every call made, in order

    async def chat(self, key: str, tenant: str, tier: str, body: dict[str, Any]) -> Call:
        """Stream one chat completion of ``body`` (sent with ``service_tier=tier``)."""
        payload = json.dumps({**body, "model": self.model, "stream": True, "service_tier": tier,
                              "stream_options": {"include_usage": True}}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        call = Call(tenant, tier, time.perf_counter(), int(body.get("max_tokens") or 0))
        self.calls.append(call)
        writer = None
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            call.sent = time.perf_counter()
            writer.write(head + payload)
            await _read_answer(reader, call)
        except asyncio.CancelledError:
            call.cancelled = True
            raise
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            call.error = call.error or repr(exc)
        finally:
            if writer is not None:
                writer.close()
        return call


async def _read_answer(reader: asyncio.StreamReader, call: Call) -> None:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    call.status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    call.retry_after = headers.get("retry-after")
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    if call.status != 200:
        if chunked:
            async for piece in _chunks(reader):
                call.body += piece
        else:
            call.body = await reader.readexactly(int(headers.get("content-length", "0")))
        return
    buf = b""
    async for piece in _chunks(reader) if chunked else _raw(reader):
        buf += piece
        *events, buf = buf.split(b"\n\n")
        now = time.perf_counter()
        for event in events:
            _on_event(call, event, now)


def _on_event(call: Call, event: bytes, now: float) -> None:
    for line in event.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            call.done = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            call.error = str(obj["error"])
        if obj.get("usage"):
            call.tokens = int(obj["usage"]["completion_tokens"])
            call.prompt_tokens = int(obj["usage"]["prompt_tokens"])
        for choice in obj.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                call.events += 1
                call.last = now
                call.times.append(now)
                if call.first is None:
                    call.first = now


async def _chunks(reader: asyncio.StreamReader) -> Any:
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            return
        yield (await reader.readexactly(size + 2))[:-2]


async def _raw(reader: asyncio.StreamReader) -> Any:
    while piece := await reader.read(65536):
        yield piece


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> metric name -> [(labels, value)] (enough for Carpool's own)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        pairs = {}
        for item in labels.rstrip("}").split('",'):
            k, sep, v = item.partition('="')
            if sep:
                pairs[k.strip(", ")] = v.rstrip('"')
        out.setdefault(name, []).append((pairs, float(value)))
    return out


def metric_sum(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str,
               **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for lab, v in metrics.get(name, ()) if all(lab.get(k) == x
                                                            for k, x in labels.items()))
