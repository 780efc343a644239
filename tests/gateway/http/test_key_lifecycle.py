"""Key lifecycle over real HTTP and Redis: names and expiry (401 key_expired within the auth
cache time), rotation with a grace period, listings without secrets, last use written at most
once a minute, tenant deletion (keys revoked, requests cancelled, ledger kept), read-only
admin keys, and clear 4xx on bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.faults.stack import wait_for
from tests.gateway.harness import make_config, make_tenant, run_gateway
from tests.gateway.http.ledger_helpers import ledger_total
from tests.gateway.worker.drainer_hold import HeldWorker, start_drainer, stop_drainer

pytestmark = pytest.mark.timeout(90)
ADMIN_KEY = "cp-admin-" + "l" * 32
BODY = {"model": "echo", "prompt": "a b", "max_tokens": 2}


@pytest.fixture(scope="module")
def slow_echo(redis_url: str, tiny_model_dir: Path) -> Iterator[Any]:
    """Echo at 20 ms a step: a long request is still running when the test acts on it."""
    config = make_config(engine="echo", model=str(tiny_model_dir), echo_step_ms=20.0)
    with run_gateway(config, redis_url, worker_type=HeldWorker) as gw:
        gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
        yield gw


@pytest.fixture()
def admin(echo_gateway: Any) -> dict[str, str]:
    echo_gateway.call(echo_gateway.services.store.add_admin_key(ADMIN_KEY))
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def post(gw: Any, key: str) -> httpx.Response:
    return httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30,
                      headers={"Authorization": f"Bearer {key}"})


def test_rotate_with_grace_then_expiry(echo_gateway: Any, redis_url: str,
                                       admin: dict[str, str]) -> None:
    gw = echo_gateway
    make_tenant(redis_url, gw.config.namespace, "rot")
    first = httpx.post(gw.url + "/admin/tenants/rot/keys", headers=admin,
                       json={"name": "ci deploy", "expires_in_s": 3600}).json()
    assert first["name"] == "ci deploy" and first["expires_at"] > time.time() + 3500
    assert post(gw, first["key"]).status_code == 200
    r = httpx.post(gw.url + f"/admin/tenants/rot/keys/{first['key_id']}/rotate",
                   headers=admin, json={"grace_s": 600})
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["old_key_expires_at"] <= time.time() + 600
    assert post(gw, first["key"]).status_code == 200 and post(gw, new["key"]).status_code == 200
    listing = httpx.get(gw.url + "/admin/tenants/rot/keys", headers=admin)
    rows = {k["key_id"]: k for k in listing.json()["data"]}
    assert rows[first["key_id"]]["expires_at"] == new["old_key_expires_at"]
    assert rows[new["key_id"]]["name"] == "ci deploy" and rows[new["key_id"]]["expires_at"] is None
    assert set(rows[new["key_id"]]) == {"key_id", "name", "created", "last_used", "expires_at"}
    for secret in (first["key"], new["key"]):
        assert secret not in listing.text and secret[3:] not in listing.text
    # no grace: the old key expires now, and every gateway says so within the cache time
    r = httpx.post(gw.url + f"/admin/tenants/rot/keys/{new['key_id']}/rotate", headers=admin,
                   json={"grace_s": 0})
    assert r.status_code == 201
    refused = wait_for(lambda: (x := post(gw, new["key"])).status_code == 401 and x, 5)
    assert refused.json()["error"]["code"] == "key_expired"
    assert post(gw, r.json()["key"]).status_code == 200


def test_last_used_at_most_once_a_minute(echo_gateway: Any, redis_url: str,
                                         admin: dict[str, str]) -> None:
    gw = echo_gateway
    key = make_tenant(redis_url, gw.config.namespace, "seen")
    assert post(gw, key).status_code == 200
    (row,) = httpx.get(gw.url + "/admin/tenants/seen/keys", headers=admin).json()["data"]
    assert row["last_used"] is not None and row["last_used"] >= row["created"]
    store = gw.services.store
    digest = gw.call(store.redis.hget(gw.services.keys.tenant_keys("seen"), row["key_id"]))
    apikey = gw.services.keys.apikey(digest.decode())
    gw.call(store.redis.hset(apikey, "last_used", str(int(time.time()) - 30)))
    time.sleep(gw.config.auth_cache_s + 0.1)  # past the auth cache: looked up again
    assert post(gw, key).status_code == 200
    assert int(gw.call(store.redis.hget(apikey, "last_used"))) < time.time() - 29  # kept
    gw.call(store.redis.hset(apikey, "last_used", str(int(time.time()) - 61)))
    time.sleep(gw.config.auth_cache_s + 0.1)
    assert post(gw, key).status_code == 200
    assert int(gw.call(store.redis.hget(apikey, "last_used"))) >= time.time() - 5  # written


def test_bad_key_input(echo_gateway: Any, redis_url: str, admin: dict[str, str]) -> None:
    gw = echo_gateway
    make_tenant(redis_url, gw.config.namespace, "badin")
    url = gw.url + "/admin/tenants/badin/keys"
    for body, param in (({"expires_at": "2001-01-01"}, "expires_at"),
                        ({"expires_in_s": -5}, "expires_at"),
                        ({"expires_at": "soon"}, "expires_at"),
                        ({"name": "x" * 65}, "name"),
                        ({"expires_at": 1, "expires_in_s": 5}, "expires_at")):
        r = httpx.post(url, headers=admin, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    kid = httpx.post(url, headers=admin).json()["key_id"]
    r = httpx.post(f"{url}/{kid}/rotate", headers=admin, json={"grace_s": -1})
    assert r.status_code == 400 and "grace_s" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/nokey/rotate", headers=admin).status_code == 404
    assert httpx.post(gw.url + "/admin/tenants/ghost/keys", headers=admin).status_code == 404
    # nothing half-written: the tenant's first key and the one issued above
    ids = httpx.get(url, headers=admin).json()["key_ids"]
    assert len(ids) == 2 and kid in ids


def test_delete_tenant(slow_echo: Any, redis_url: str) -> None:
    gw = slow_echo
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    key = make_tenant(redis_url, gw.config.namespace, "gone")
    user = {"Authorization": f"Bearer {key}"}
    assert post(gw, key).status_code == 200
    # one request running (its first tokens arrived), one queued behind a held drainer
    with httpx.stream("POST", gw.url + "/v1/completions", timeout=30, headers=user,
                      json={**BODY, "max_tokens": 400, "stream": True}) as running:
        lines = running.iter_lines()
        assert next(ln for ln in lines if '"text":"' in ln and '"text":""' not in ln)
        stop_drainer(gw)
        try:
            with httpx.stream("POST", gw.url + "/v1/completions", timeout=30, headers=user,
                              json={**BODY, "stream": True}) as queued:
                r = httpx.delete(gw.url + "/admin/tenants/gone", headers=admin)
                assert r.status_code == 200 and r.json()["cancelled_requests"] == 2, r.text
                tail = queued.read().decode()
            rest = "\n".join(lines)
        finally:
            start_drainer(gw)
    for end in (tail, rest):
        assert '"finish_reason":"abort"' in end and end.rstrip().endswith("data: [DONE]")
    served = 0  # within the auth cache time of the delete, a gateway may still serve it
    while (refused := post(gw, key)).status_code == 200 and served < 50:
        served += 1
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.delete(gw.url + "/admin/tenants/gone", headers=admin).status_code == 404
    assert "gone" not in [t["id"] for t in httpx.get(gw.url + "/admin/tenants",
                                                     headers=admin).json()["data"]]
    row = ledger_total(gw, "gone", requests=3 + served)
    assert row.errors == {"cancelled": 2}
    usage = httpx.get(gw.url + "/admin/usage", params={"tenant": "gone"}, headers=admin)
    assert usage.status_code == 200
    assert sum(r["requests"] for r in usage.json()["data"]) == row.requests == 3 + served


def test_read_only_admin_key(echo_gateway: Any, admin: dict[str, str]) -> None:
    gw = echo_gateway
    r = httpx.post(gw.url + "/admin/keys", headers=admin, json={"read_only": True})
    assert r.status_code == 201 and r.json()["read_only"] is True
    ro = {"Authorization": f"Bearer {r.json()['key']}"}
    for path in ("/admin/tenants", "/admin/stats", "/admin/tiers", "/admin/usage"):
        assert httpx.get(gw.url + path, headers=ro).status_code == 200, path
    for method, path, body in (("POST", "/admin/tenants", {"id": "ro-made"}),
                               ("POST", "/admin/keys", {}),
                               ("DELETE", "/admin/tenants/anyone", None)):
        r = httpx.request(method, gw.url + path, headers=ro,
                          content=json.dumps(body) if body is not None else None)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_read_only"
    assert httpx.post(gw.url + "/admin/keys", headers=admin,
                      json={"read_only": "yes"}).status_code == 400


def test_key_lifecycle_cli(echo_gateway: Any, redis_url: str) -> None:
    import subprocess
    import sys

    from tests.gateway.harness import SECRET

    gw = echo_gateway
    make_tenant(redis_url, gw.config.namespace, "clikeys")
    env = {"REDIS_URL": redis_url, "CARPOOL_NAMESPACE": gw.config.namespace,
           "CARPOOL_SECRET": SECRET.decode(), "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> tuple[int, str]:
        res = subprocess.run([sys.executable, "-m", "gateway.cli.main", "tenants", *args],
                             env=env, capture_output=True, text=True, timeout=30, check=False)
        return res.returncode, res.stdout + res.stderr

    rc, out = cli("issue-key", "clikeys", "--name", "nightly", "--expires", "2030-01-01")
    assert rc == 0, out
    key = out.split("key (shown once): ")[1].split()[0]
    kid = out.split("key id: ")[1].split()[0]
    rc, out = cli("keys", "clikeys")
    (line,) = [ln for ln in out.splitlines() if ln.startswith(kid)]
    assert line.split()[1] == "nightly" and line.split()[-1] == "2030-01-01T00:00:00Z"
    assert key not in out
    rc, out = cli("rotate-key", "clikeys", kid, "--grace", "60")
    assert rc == 0 and "valid until" in out, out
    assert cli("rotate-key", "clikeys", kid, "--grace", "-3")[0] == 2
    assert cli("issue-key", "clikeys", "--expires", "2001-01-01")[0] == 2
    rc, out = cli("admin-key", "--read-only")
    assert rc == 0 and "read-only" in out
    ro = out.split("): ")[1].split()[0]
    assert gw.call(gw.services.store.admin_role(ro)) == "read"
    rc, out = cli("delete", "clikeys")
    assert rc == 0 and "0 requests cancelled" in out
    assert cli("delete", "clikeys")[0] == 1
