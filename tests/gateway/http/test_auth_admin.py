"""Keys, admin endpoints and the ``carpool tenants`` CLI: keys are random, prefixed, stored only
as HMACs and never logged; revocation is visible within 1 s; quota changes apply at run time."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from gateway.tenancy.keys import KEY_PREFIX, generate_key, key_digest
from tests.gateway.harness import SECRET, make_tenant, redis_sync

pytestmark = pytest.mark.timeout(60)
ADMIN_KEY = "cp-admin-" + "k" * 32


def test_key_shape_and_randomness() -> None:
    keys = {generate_key() for _ in range(1000)}
    assert len(keys) == 1000
    for k in list(keys)[:50]:
        assert k.startswith(KEY_PREFIX) and len(k) - len(KEY_PREFIX) >= 32  # 192 bits b64
    assert generate_key(admin=True).startswith("cp-admin-")


def test_only_hmac_stored_and_key_never_logged(echo_gateway: Any, redis_url: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    ns = echo_gateway.config.namespace
    caplog.set_level(logging.DEBUG)
    key = make_tenant(redis_url, ns, "secretive")
    r = httpx.post(echo_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "echo", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200
    httpx.post(echo_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}x"},
               json={"model": "echo", "prompt": "hi"})
    rs = redis_sync(redis_url)
    try:
        dump = b"".join(k + repr(rs.dump(k)).encode() for k in rs.scan_iter(f"{ns}:*"))
    finally:
        rs.close()
    assert key.encode() not in dump and key.split("-", 1)[1].encode() not in dump
    assert key_digest(SECRET, key).encode() in dump
    assert key not in caplog.text and key[3:] not in caplog.text


def test_admin_endpoints_and_revocation_within_1s(echo_gateway: Any) -> None:
    url = echo_gateway.url
    echo_gateway.call(echo_gateway.services.store.add_admin_key(ADMIN_KEY))
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.post(url + "/admin/tenants", headers=admin, json={
        "id": "newco", "rpm": 100, "allowed_tiers": ["batch"], "default_tier": "batch",
        "weight": 2})
    assert r.status_code == 201, r.text
    assert httpx.post(url + "/admin/tenants", headers=admin,
                      json={"id": "bad", "rpm": -1}).status_code == 400
    assert httpx.post(url + "/admin/tenants", headers=admin,
                      json={"id": "bad", "weight": 0}).status_code == 400
    issued = httpx.post(url + "/admin/tenants/newco/keys", headers=admin).json()
    key, kid = issued["key"], issued["key_id"]
    user = {"Authorization": f"Bearer {key}"}
    body = {"model": "echo", "prompt": "hi", "max_tokens": 2}
    ok = httpx.post(url + "/v1/completions", headers=user, json=body)
    assert ok.status_code == 200 and ok.json()["service_tier"] == "batch"
    # a tenant key is not an admin key
    assert httpx.get(url + "/admin/tenants", headers=user).status_code == 401
    names = [t["id"] for t in httpx.get(url + "/admin/tenants", headers=admin).json()["data"]]
    assert "newco" in names
    # quota change at run time
    r = httpx.patch(url + "/admin/tenants/newco", headers=admin,
                    json={"allowed_tiers": ["interactive", "batch"]})
    assert r.status_code == 200 and r.json()["rpm"] == 100 and r.json()["weight"] == 2.0
    time.sleep(echo_gateway.config.auth_cache_s + 0.1)
    r = httpx.post(url + "/v1/completions", headers={**user, "X-Carpool-Tier": "interactive"},
                   json=body)
    assert r.status_code == 200
    # revocation: the key stops working within 1 s
    assert httpx.get(url + "/admin/tenants/newco/keys", headers=admin).json()["key_ids"] == [kid]
    revoked_at = time.monotonic()
    assert httpx.delete(url + f"/admin/tenants/newco/keys/{kid}", headers=admin).status_code == 200
    while httpx.post(url + "/v1/completions", headers=user, json=body).status_code == 200:
        assert time.monotonic() - revoked_at < 1.0
        time.sleep(0.05)
    assert time.monotonic() - revoked_at < 1.0
    assert httpx.delete(url + f"/admin/tenants/newco/keys/{kid}", headers=admin).status_code == 404
    stats = httpx.get(url + "/admin/stats", headers=admin).json()
    assert stats["admitted"] >= 2


def test_tenants_cli_without_torch(redis_url: str, tmp_path: Any,
                                   tiny_gateway: Any) -> None:
    """`carpool tenants` against the same Redis: create, set quota, issue and revoke a key;
    the issued key works on the running gateway, and torch is never imported."""
    ns = tiny_gateway.config.namespace
    env = {"REDIS_URL": redis_url, "CARPOOL_NAMESPACE": ns, "CARPOOL_SECRET": SECRET.decode(),
           "PATH": "/usr/bin:/bin"}
    probe = ("import sys; from gateway.cli.main import main; rc = main(sys.argv[1:]); "
             "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")

    def cli(*args: str) -> str:
        res = subprocess.run([sys.executable, "-c", probe, "tenants", *args], env=env,
                             capture_output=True, text=True, timeout=30, check=False, cwd=str(tmp_path.parent))
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    out = cli("create", "cli-co", "--rpm", "50", "--allowed-tiers", "interactive,batch")
    key = next(ln.split(": ")[1] for ln in out.splitlines() if ln.startswith("key (shown once)"))
    assert '"rpm": 50' in cli("list")
    assert '"tpm": 999' in cli("set-quota", "cli-co", "--tpm", "999")
    model = tiny_gateway.engine.model_name
    r = httpx.post(tiny_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    kid = cli("keys", "cli-co").split()[0]
    assert "revoked" in cli("revoke-key", "cli-co", kid)
    time.sleep(1.0)
    r = httpx.post(tiny_gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 401
