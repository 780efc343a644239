"""Waiting for a worker's output writer in tests."""

from __future__ import annotations

import asyncio

from gateway.worker.writer import OutputWriter


async def flushed(writer: OutputWriter, timeout_s: float = 10.0) -> None:
    """Until the writer is idle: what was submitted so far is written (its task must run)."""
    async with asyncio.timeout(timeout_s):
        while not writer.idle:
            await asyncio.sleep(0.005)
