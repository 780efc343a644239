"""run_on_fresh_thread: the work runs on a thread that is gone afterwards; errors come back."""

from __future__ import annotations

import threading

import pytest

from engine.runner.fresh_thread import run_on_fresh_thread


def test_returns_the_result_from_a_thread_that_has_exited() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    assert run_on_fresh_thread(work) == 42
    (worker,) = seen
    assert worker is not threading.current_thread()
    assert not worker.is_alive()


def test_reraises_the_error_on_the_callers_thread() -> None:
    def fail() -> None:
        raise FileNotFoundError("no such model")

    with pytest.raises(FileNotFoundError, match="no such model"):
        run_on_fresh_thread(fail)
