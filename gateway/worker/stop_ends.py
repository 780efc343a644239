"""How a stopping worker ends the requests it runs (``Worker._end_inflight``).

Every request the worker runs is aborted; the engine's abort outputs are not waited
for (``inflight`` is cleared, ``_on_step`` drops them), so each is ended here by
what Redis says of it, read in one round trip once what was produced is written:
  cancelled  (a cancel mark, or a cancel seen here) finished as an abort, as the
             engine's abort output would have been: counted aborted, acked
  sent       (its reader has output) cannot run again from the start: with
             ``hand_off`` to a live worker (``target``), handed to it (below); else
             finished with a worker-lost error now, as a worker reclaiming it would
             after the visibility timeout, so its relay ends at once
  neither    left pending in its queue, as a dead worker's: with ``hand_off``, the
             worker handed to runs it now; else the next worker to reclaim it runs
             it from the start. Its client sees only the delay.
The hand-off (``drain``): ``target``, a live worker that is not draining, is told
on the cancel channel to take every entry we hold, at once, and resumes
each from the tokens its reader has (``recovery.py``), as it would a dead worker's
but without waiting to find us dead. We wait for it to have claimed them; if it
does not, they are ours still, and taken over as a dead worker's once we are gone.
"""

from __future__ import annotations

from typing import Any

from engine.core.finish import FinishReason
from engine.core.outputs import RequestOutput
from gateway.worker.writer import Inflight

STOPPED_ERROR = "worker lost: it shut down mid-generation; partial output was already streamed"
DRAINED_ERROR = ("worker lost: it stopped at its drain deadline and no other worker was alive "
                 "to take over; partial output was already streamed")


def stop_end(rec: Inflight, sent: Any, cancel: Any, error: str = STOPPED_ERROR
              ) -> tuple[Inflight, RequestOutput] | None:
    """The end a stopping worker writes for ``rec`` (None: leave it pending), given its
    'sent' and 'cancel' marks (``sent`` None: not to be ended with ``error``)."""
    if cancel is not None or rec.reader_gone:
        rec.reader_gone = rec.reader_gone or cancel in (b"gone", "gone")
        return rec, RequestOutput(rec.request_id, [], "", True, FinishReason.ABORT, 0, 0)
    if sent is not None:
        return rec, RequestOutput(rec.request_id, [], "", True, FinishReason.ERROR, 0, 0,
                                  error=error)
    return None
