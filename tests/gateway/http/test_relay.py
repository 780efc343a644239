"""The relay against stub services: the disconnect watcher cancels it only while it relays,
a cancel from outside in the same turn as a disconnect still ends it, and output that queued
up while it was busy goes out as one SSE event, and a relay that starts once the open ones
were ended for a shutdown ends at once; the shutdown's last event to a client that stopped
reading gives up well within the shutdown margin."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.bus.messages import FinishMsg, TokenMsg
from gateway.cli.serve import END_MARGIN_S
from gateway.http.errors import SHUTDOWN_RETRY_AFTER_S
from gateway.http.openai.format import Formatter
from gateway.http.relay import RelayContext, RelayResponse
from gateway.http.shutdown import Shutdown

pytestmark = pytest.mark.timeout(10)


class Mux:
    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[Any]] = {}

    def register(self, key: str) -> asyncio.Queue[Any]:
        return self.queues.setdefault(key, asyncio.Queue())

    def unregister(self, key: str) -> None:
        self.queues.pop(key, None)


def make_services(calls: list[str]) -> Any:
    async def cancel(rid: str, tenant: str, reader_gone: bool, reason: str,
                     tier: str | None = None) -> str:
        calls.append(f"cancel:{reason}")
        return "running"

    async def delete(*keys: str) -> int:
        return 1

    async def settle(*args: Any, **kwargs: Any) -> None:
        calls.append(f"settle:{args[4]}")

    ev = SimpleNamespace(first_token=lambda *a, **k: None, tokens=lambda *a, **k: None,
                         request_cancelled=lambda *a, **k: None,
                         request_finished=lambda *a, **k: None)
    return SimpleNamespace(
        mux=Mux(), keys=SimpleNamespace(out=lambda rid, tenant: f"out:{rid}"), events=ev,
        config=SimpleNamespace(stall_timeout_s=5.0, request_timeout_s=0.05),
        canceller=SimpleNamespace(cancel=cancel), redis=SimpleNamespace(delete=delete),
        quota=SimpleNamespace(settle=settle), shutdown=Shutdown())


def make_ctx(deadline_in: float, stream: bool = False) -> RelayContext:
    loop = asyncio.get_running_loop()
    return RelayContext("r1", SimpleNamespace(id="t"), "interactive", 3, 10, stream, False,
                        SimpleNamespace(kind="text"), loop.time(), loop.time() + deadline_in)


def client_that_leaves() -> tuple[asyncio.Event, Any]:
    """An ASGI receive that reports ``http.disconnect`` once the event is set."""
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    return gone, receive


async def test_disconnect_while_sending_the_504_does_not_escape_as_cancelled() -> None:
    """Deadline fires -> the 504's send blocks (client not reading) -> the client leaves:
    nothing cancels the relay in the middle of its error handling."""
    calls: list[str] = []
    relay = RelayResponse(make_services(calls), make_ctx(0.02))
    gone, receive = client_that_leaves()
    send_blocked = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        send_blocked.set()
        await asyncio.sleep(0.3)  # the socket's buffer is full

    task = asyncio.create_task(relay({"type": "http"}, receive, send))
    await send_blocked.wait()
    gone.set()
    await asyncio.wait({task}, timeout=3)
    assert calls == ["cancel:deadline", "settle:settled:aborted"]
    assert not task.cancelled(), "our own disconnect cancel escaped __call__"


async def test_external_cancel_in_the_same_turn_as_a_disconnect_is_not_swallowed() -> None:
    calls: list[str] = []
    relay = RelayResponse(make_services(calls), make_ctx(5.0))
    gone, receive = client_that_leaves()

    async def send(message: dict[str, Any]) -> None:
        pass

    real_watch = relay._watch

    async def watch_then_shutdown(receive: Any, me: Any) -> None:
        await real_watch(receive, me)  # relay.cancel() (count 1)
        me.cancel()  # uvicorn's shutdown cancel in the same turn (count 2)

    relay._watch = watch_then_shutdown  # type: ignore[method-assign]
    task = asyncio.create_task(relay({"type": "http"}, receive, send))
    await asyncio.sleep(0.01)
    gone.set()
    await asyncio.wait({task}, timeout=3)
    assert task.cancelled(), "the shutdown cancel was swallowed by uncancel()"


async def test_a_disconnect_while_relaying_cancels_end_to_end() -> None:
    calls: list[str] = []
    relay = RelayResponse(make_services(calls), make_ctx(5.0))
    gone, receive = client_that_leaves()

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent to a client that left")

    task = asyncio.create_task(relay({"type": "http"}, receive, send))
    await asyncio.sleep(0.01)  # waiting for output that never comes
    gone.set()
    await asyncio.wait({task}, timeout=3)
    assert task.done() and not task.cancelled()
    assert calls == ["cancel:disconnect", "settle:settled:aborted"]


async def test_batches_that_queued_up_go_out_as_one_sse_event() -> None:
    calls: list[str] = []
    services = make_services(calls)
    ctx = make_ctx(5.0, stream=True)
    ctx = RelayContext(ctx.request_id, ctx.tenant, ctx.tier, ctx.prompt_tokens,
                       ctx.reserved_tokens, True, True,
                       Formatter("completion", "r1", "m", 0, "interactive"),
                       ctx.started, ctx.deadline)
    relay = RelayResponse(services, ctx)
    queue = services.mux.register("out:r1")
    # three engine steps the relay has not read yet (a busy loop), then the finish
    for text in ("Hel", "lo", " there"):
        queue.put_nowait([TokenMsg([1], text)])
    queue.put_nowait([FinishMsg("length", 3, 3)])
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    _, receive = client_that_leaves()
    await asyncio.wait_for(relay({"type": "http"}, receive, send), 3)
    events = [e for e in b"".join(sent).split(b"\n\n") if e]
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events
             if e.startswith(b"data: {") and b'"text"' in e]
    assert texts[0] == "Hello there"  # one event for the three steps already there
    assert events[-1] == b"data: [DONE]"
    assert b'"completion_tokens":3' in b"".join(sent)
    assert calls == ["settle:settled:completed"]


async def test_a_relay_that_starts_after_end_inflight_ends_at_once() -> None:
    """Admitted while the open relays were being ended: it answers 503 + Retry-After and
    cancels its request instead of relaying past the server's graceful period."""
    calls: list[str] = []
    services = make_services(calls)
    assert services.shutdown.end_inflight() == 0
    relay = RelayResponse(services, make_ctx(5.0))
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    _, receive = client_that_leaves()
    await asyncio.wait_for(relay({"type": "http"}, receive, send), 3)
    assert sent[0]["status"] == 503
    assert (b"retry-after", str(SHUTDOWN_RETRY_AFTER_S).encode()) in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "server_shutdown"
    assert calls == ["cancel:shutdown", "settle:settled:aborted"]
    assert services.shutdown.end_inflight() == 0  # none left open


async def test_a_shutdown_end_to_a_client_that_stopped_reading_ends_within_the_margin() -> None:
    """The shutdown's error event cannot be sent (the client's socket buffer is full): the
    relay still cancels, settles and returns well within ``END_MARGIN_S``, before uvicorn's
    own cancel would land in the send (a traceback), not after the 30 s stall timeout."""
    calls: list[str] = []
    services = make_services(calls)
    services.config.stall_timeout_s = 30.0
    relay = RelayResponse(services, make_ctx(30.0, stream=True))
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # never drains

    _, receive = client_that_leaves()
    task = asyncio.create_task(relay({"type": "http"}, receive, send))
    while not sent:  # the headers went out: it relays
        await asyncio.sleep(0.001)
    loop = asyncio.get_running_loop()
    ended_at = loop.time()
    assert services.shutdown.end_inflight() == 1
    await asyncio.wait({task}, timeout=5)
    assert task.done() and not task.cancelled()
    assert loop.time() - ended_at < END_MARGIN_S
    assert calls == ["cancel:shutdown", "settle:settled:aborted"]
