"""A real Sentinel set for the tests, from the embedded server's binary: one master, one
replica and one sentinel (quorum 1) watching them as ``mymaster``, quick to fail over
(``DOWN_AFTER_MS``). Bounded: every wait has a deadline, and ``stop`` kills what it started."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import redis as sync_redis

from gateway.bench.redis_servers import valkey_binary, wait_until
from gateway.process import free_port

DOWN_AFTER_MS = 1000
FORM_TIMEOUT_S = 20.0
SERVICE = "mymaster"


class SentinelSet:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self._root: Path | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{SERVICE}"

    def _start(self, name: str, args: list[str]) -> None:
        binary = valkey_binary()
        assert binary is not None and self._root is not None
        self.procs[name] = subprocess.Popen([str(binary), *args], cwd=self._root,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self, name: str) -> Any:
        return sync_redis.Redis(port=self.ports[name], socket_timeout=5)

    def start(self) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix="carpool-sentinel-"))
        deadline = time.monotonic() + FORM_TIMEOUT_S
        try:
            for name in ("master", "replica", "sentinel"):
                self.ports[name] = free_port()
            common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            self._start("master", ["--port", str(self.ports["master"]), *common,
                                   "--dir", str(self._root)])
            self._start("replica", ["--port", str(self.ports["replica"]), *common,
                                    "--dir", str(self._root), "--replicaof", "127.0.0.1",
                                    str(self.ports["master"])])
            conf = self._root / "sentinel.conf"
            conf.write_text(
                f"port {self.ports['sentinel']}\nbind 127.0.0.1\ndir {self._root}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['master']} 1\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n")
            self._start("sentinel", [str(conf), "--sentinel"])
            wait_until(self._replica_known, deadline, "the sentinel set", poll_s=0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_known(self) -> bool:
        try:
            replicas: Any = self.client("sentinel").execute_command("SENTINEL", "REPLICAS",
                                                                     SERVICE)
            synced = self.client("replica").info("replication").get("master_link_status")
        except sync_redis.RedisError:
            return False
        return bool(replicas) and synced == "up"

    def master_port(self) -> int:
        addr: Any = self.client("sentinel").execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(addr[1])

    def kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
