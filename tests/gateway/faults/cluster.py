"""One gateway and two worker processes (the tiny real engine) on one Redis, for the fault
tests that kill or stop a worker mid-stream: started once, all at once, for the fault tests
(a package fixture); a test that ended a worker gets a fresh one in its place from
``workers()``. Each test uses its own tenant, so its ledger and usage are its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.process import free_port
from tests.gateway.procs import Proc, ready, spawn_all, start, stop

ENGINE = ["--engine", "real", "--num-blocks", "256", "--block-size", "16", "--max-model-len",
          "1024", "--max-num-seqs", "8"]
# drain deadline 0: a SIGTERM hands off at once, while every stream is mid-generation; the
# visibility timeout is long: a dead worker is found by its missing status, a stopped one
# hands off, nothing is reclaimed by idleness
WORKER = [*ENGINE, "--drain-timeout", "0"]
ENV = {"CARPOOL_VISIBILITY_TIMEOUT_S": "60"}


class Cluster:
    def __init__(self, redis_url: str, model_dir: Path, tmp: Path, gateway: Proc,
                 workers: list[tuple[Proc, int]], ns: str) -> None:
        self.redis_url, self.model_dir, self.tmp, self.ns = redis_url, model_dir, tmp, ns
        self.gateway, self._workers = gateway, workers

    def _start_worker(self) -> tuple[Proc, int]:
        port = free_port()
        return start("worker", self.redis_url, self.ns, self.model_dir, self.tmp, *WORKER,
                     "--metrics-port", str(port), env=ENV), port

    def workers(self) -> list[tuple[Proc, int]]:
        """The two workers, each one that has exited replaced by a fresh one (with its own
        metrics port): (process, metrics port)."""
        fresh = [i for i, (proc, _) in enumerate(self._workers) if proc.popen.poll() is not None]
        for i in fresh:
            self._workers[i] = self._start_worker()
        for i in fresh:
            ready(self._workers[i][0])
        return list(self._workers)

    def stop(self) -> None:
        for proc, _ in self._workers:
            stop(proc)


@contextmanager
def cluster(redis_url: str, model_dir: Path, tmp: Path) -> Iterator[Cluster]:
    ns = f"mig{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]
    with spawn_all(redis_url, ns, model_dir, tmp, ("gateway", ENGINE),
                   *[("worker", [*WORKER, "--metrics-port", str(p)]) for p in ports],
                   env=ENV) as (gw, wa, wb):
        running = Cluster(redis_url, model_dir, tmp, gw, [(wa, ports[0]), (wb, ports[1])], ns)
        try:
            yield running
        finally:
            running.stop()  # the replacements too, before the gateway
