"""Redis over TLS with a CA file and an ACL user, against a real TLS server: Debian's
``redis-server`` (the embedded Valkey binary is built without TLS; ``make setup`` installs
it where apt is there). The gateway and its worker serve through ``rediss://`` with
``redis_ca`` (``--redis-ca``); a certificate from another CA and a wrong password stop
``carpool serve`` at start with one line, no traceback. Certificates come from ``openssl``;
set-up is bounded (a few seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.bus.client import check_redis
from gateway.process import free_port
from tests.gateway.harness import make_config, make_tenant, run_gateway

REDIS_SERVER = shutil.which("redis-server")
OPENSSL = shutil.which("openssl")
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server with TLS (make setup "
                       "installs Debian's; the embedded Valkey binary has no TLS)"),
    pytest.mark.skipif(OPENSSL is None, reason="no openssl to make the test certificates"),
]
PASSWORD = "s3cret-pw"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([str(OPENSSL), *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def _certificates(d: Path) -> None:
    _ca(d, "ca")
    _ca(d, "other")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout",
             "server.key", "-out", "server.csr", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.cnf", "-out", "server.crt",
             cwd=d)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    d = tmp_path_factory.mktemp("tls")
    _certificates(d)
    port = free_port()
    proc = subprocess.Popen(
        [str(REDIS_SERVER), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
         "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no", "--save", "",
         "--appendonly", "no", "--dir", str(d), "--user", "default", "off",
         "--user", "carpool", "on", f">{PASSWORD}", "~*", "&*", "+@all"],
        cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                check_redis(f"rediss://carpool:{PASSWORD}@127.0.0.1:{port}"
                            f"?ssl_ca_certs={d / 'ca.crt'}")
                break
            except SystemExit:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield port, d
    finally:
        proc.kill()
        proc.wait(5)


def test_the_gateway_serves_through_tls_with_an_acl_user(
        tls_server: tuple[int, Path], tiny_model_dir: Path) -> None:
    port, d = tls_server
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=2.0,
                         redis_url=f"rediss://carpool:{PASSWORD}@127.0.0.1:{port}",
                         redis_ca=str(d / "ca.crt"))
    url = config.redis_connection_url
    assert url is not None and "ssl_ca_certs=" in url
    with run_gateway(config, url) as gw:
        key = make_tenant(url, config.namespace, "secure")
        with httpx.Client(base_url=gw.url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as c:
            body = {"model": gw.services.model.name, "prompt": "one two three", "max_tokens": 3}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3


def test_a_foreign_certificate_and_a_wrong_password_are_one_line_errors(
        tls_server: tuple[int, Path]) -> None:
    port, d = tls_server
    with pytest.raises(SystemExit) as bad_ca:
        check_redis(f"rediss://carpool:{PASSWORD}@127.0.0.1:{port}"
                    f"?ssl_ca_certs={d / 'other.crt'}")
    assert f"cannot use Redis at 127.0.0.1:{port}" in str(bad_ca.value)
    assert "certificate verify failed" in str(bad_ca.value).lower()
    with pytest.raises(SystemExit) as bad_pw:
        check_redis(f"rediss://carpool:wrong@127.0.0.1:{port}?ssl_ca_certs={d / 'ca.crt'}")
    assert "refused the user or password" in str(bad_pw.value)
    assert "wrong" not in str(bad_pw.value)  # the password is never printed


def test_carpool_serve_stops_at_start_with_one_line(tls_server: tuple[int, Path]) -> None:
    port, d = tls_server
    env: dict[str, Any] = {**os.environ, "REDIS_URL": f"rediss://carpool:wrong@127.0.0.1:{port}",
                           "CARPOOL_REDIS_CA": str(d / "ca.crt")}
    proc = subprocess.run([sys.executable, "-m", "gateway.cli.main", "serve", "--engine", "echo",
                           "--port", str(free_port())],
                          check=False, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("carpool: Redis at 127.0.0.1") and "refused" in lines[-1], lines
